#!/usr/bin/env python3
"""A stand-in for the llama-server binary: takes llama-server's flags, runs ``ggflow serve`` with its own.

llama.cpp's server tests (tools/server/tests/utils.py) start the binary named by LLAMA_SERVER_BIN_PATH with
llama-server's flags and hub model names; benchmarks/llama_server_suite.py points that variable here. Flags
with a ggflow equivalent are renamed; flags that change nothing ggflow does (--jinja, --cont-batching, ...)
are dropped; a flag ggflow serve's own parser knows is passed as it is (so --lora, --models-dir work once
ggflow has them); any other flag, and a model with no local file, end the shim with exit 3 and a line naming
what and why (the test then fails at its server start, which is what it should do).
"""
from __future__ import annotations

import argparse
import os
import sys

# llama-server's flags that take a value (as utils.py passes them), and the boolean ones
VALUE_FLAGS = ("--port", "--temp", "--seed", "--host", "--model", "--model-url", "--model-draft", "--hf-repo",
               "--hf-file", "--models-dir", "--models-max", "--models-preset", "--cors-origins", "--batch-size",
               "--ubatch-size", "--threads", "--n-gpu-layers", "--pooling", "--alias", "--tags", "--ctx-size",
               "--parallel", "-ctk", "-ctv", "-fa", "--n-predict", "--slot-save-path", "--grp-attn-n",
               "--grp-attn-w", "--lora", "--spec-type", "--api-key", "--spec-draft-n-max", "--spec-draft-n-min",
               "--spec-synth-len", "--spec-synth-rates", "--reasoning-format", "--reasoning", "--chat-template",
               "--chat-template-file", "--mmproj-url", "--media-path", "--sleep-idle-seconds", "--cache-ram",
               "--tools", "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json")

# llama-server flag -> ggflow serve flag (same meaning, same value)
RENAMED = {"--model": "--model", "--batch-size": "-b", "--ubatch-size": "-ub", "--threads": "-t",
           "--ctx-size": "-c", "--parallel": "-np", "--n-predict": "-n", "--alias": "--alias", "--port": "--port",
           "--host": "--host", "--api-key": "--api-key", "-ctk": "--cache-type-k", "-ctv": "--cache-type-v",
           "--context-shift": "--context-shift", "--embedding": "--embedding", "--reranking": "--reranking"}

# flags whose effect ggflow has anyway, or that only tune llama.cpp's own machinery
IGNORED = {"--temp": "each request's sampling options have llama.cpp's defaults already",
           "--seed": "ggflow seeds per request",
           "--offline": "ggflow never downloads here", "--n-gpu-layers": "no offload on the CPU backend",
           "--cont-batching": "ggflow always batches continuously", "--metrics": "/metrics is always served",
           "--slots": "/slots is always served", "--no-slots": "/slots is always served",
           "--jinja": "ggflow always renders the GGUF's Jinja template",
           "--no-jinja": "ggflow always renders the GGUF's Jinja template",
           "--kv-unified": "one KV cache is shared by the slots already", "--swa-full": "not a ggflow option",
           "-fa": "attention is fused already", "--verbose": "logging", "--tags": "model tags: unused",
           "--no-ui": "no web UI here", "--cache-ram": "llama.cpp's prompt cache in RAM"}

DEFAULT_MODEL = "<default model>"   # the embedded SmolLM2-135M-Instruct (tests/fixtures/default_model.py)

# the tests' hub models -> a local file, or why there is none
HUB_MODELS = {
    ("ggml-org/models", "tinyllamas/stories260K.gguf"): DEFAULT_MODEL,
    ("ggml-org/test-model-stories260K", None): DEFAULT_MODEL,
    ("ggml-org/test-model-stories260K-infill", None):
        "stories260K-infill: its FIM tokens are not in the default model's vocabulary (no offline copy)",
    ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"): "stories15M MoE: no offline copy (hub only)",
    ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"): "bert-bge-small: no offline copy (hub only)",
    ("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf"):
        "jina-reranker-v1-tiny: no offline copy (hub only)",
    ("ggml-org/tinygemma3-GGUF:Q8_0", None): "tinygemma3 with mmproj: vision models are not in ggflow",
}


class ShimError(Exception):
    pass


def _llama_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in VALUE_FLAGS:
        parser.add_argument(flag, action="append", default=None)
    return parser


def _ggflow_serve_flags() -> set[str]:
    """The option strings ggflow serve's own parser takes (whatever this branch of ggflow has)."""
    from ggflow.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return set(sub.choices["serve"]._option_string_actions)  # noqa: SLF001


def model_file(repo: str | None, file: str | None) -> str | None:
    """The local file for a hub model; None for ggflow's default; ShimError saying why there is none."""
    target = HUB_MODELS.get((repo, file), HUB_MODELS.get((repo, None)) if file is None else None)
    if target is None:
        raise ShimError(f"hub model {repo}/{file or ''} has no local mapping in benchmarks/llama_server_shim.py")
    if target != DEFAULT_MODEL:
        raise ShimError(f"hub model {repo}/{file or ''}: {target}")
    return None


def ggflow_argv(argv: list[str], known: set[str]) -> list[str]:
    """ggflow serve's arguments for llama-server's ``argv``."""
    values, rest = _llama_parser().parse_known_args(argv)
    out: list[str] = []
    given = {k: v for k, v in vars(values).items() if v is not None}
    repo, file = (given.pop("hf_repo", [None])[-1], given.pop("hf_file", [None])[-1])
    if "model" not in given and repo is not None:
        path = model_file(repo, file)
        if path is not None:
            out += ["--model", path]
    for flag in VALUE_FLAGS:
        key = flag.lstrip("-").replace("-", "_")
        for value in given.get(key, []):
            if flag in IGNORED or (flag == "--n-predict" and value.lstrip("-").isdigit() and int(value) < 0):
                continue   # n_predict -1 is llama-server's "no cap": ggflow serve's default
            if flag in RENAMED:
                out += [RENAMED[flag], value]
            elif flag in known:
                out += [flag, value]
            else:
                raise ShimError(f"llama-server's {flag} {value}: ggflow serve has no such option")
    for flag in rest:
        if flag in IGNORED:
            continue
        if flag in RENAMED:
            out.append(RENAMED[flag])
        elif flag in known:
            out.append(flag)
        else:
            raise ShimError(f"llama-server's {flag}: ggflow serve has no such option")
    return out


def main(argv: list[str]) -> int:
    try:
        args = ggflow_argv(argv, _ggflow_serve_flags())
    except ShimError as exc:
        print(f"llama_server_shim: {exc}", file=sys.stderr, flush=True)
        return 3
    print("llama_server_shim: ggflow serve " + " ".join(args), file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "ggflow.cli", "serve", *args])   # keeps the pid the tests stop


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
