"""``ggflow info``: what a GGUF model file is: architecture, hyperparameters, tensor types, tokenizer."""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("info", help="describe a GGUF model file",
                                   description="Architecture, hyperparameters, tensor types and tokenizer.")
    parser.add_argument("-m", "--model", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run)


def describe(path: str) -> dict[str, Any]:
    from ggflow.core.model import Model

    model = Model.load(path)
    types = collections.Counter(t.type.name for t in model.weights.values())
    meta = model.metadata
    return {
        "path": path,
        "name": meta.get("general.name", ""),
        "architecture": meta.arch,
        "hparams": {k: v for k, v in dataclasses.asdict(model.hparams).items() if k != "extra"},
        "params": model.n_params,
        "size_bytes": model.size_bytes,
        "tensor_types": dict(types.most_common()),
        "tokenizer": meta.get("tokenizer.ggml.model", ""),
        "tokenizer_pre": meta.get("tokenizer.ggml.pre", ""),
        "has_chat_template": meta.get("tokenizer.chat_template") is not None,
    }


def run(args: argparse.Namespace) -> int:
    from ggflow.cli.common import model_path

    info = describe(model_path(args))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['path']}\n  {info['name']} ({info['architecture']}), {info['params'] / 1e6:.1f} M params, "
          f"{info['size_bytes'] / 2**20:.1f} MiB")
    print("  " + ", ".join(f"{k}={v}" for k, v in info["hparams"].items()))
    print("  tensor types: " + ", ".join(f"{k} x{v}" for k, v in info["tensor_types"].items()))
    print(f"  tokenizer: {info['tokenizer']} ({info['tokenizer_pre']}), chat template: "
          f"{'yes' if info['has_chat_template'] else 'no'}")
    return 0
