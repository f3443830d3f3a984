"""Options shared by the commands that load a model."""
from __future__ import annotations

import argparse
import dataclasses


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("-c", "--ctx-size", type=int, default=2048, help="context size in tokens (default 2048)")
    parser.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    parser.add_argument("-b", "--ubatch-size", type=int, default=512, help="tokens per graph evaluation")
    parser.add_argument("--backend", default="auto", help="backend name(s), comma separated (default: auto)")
    parser.add_argument("--cache-type-k", default="F16", help="KV cache type for K (F16, F32)")
    parser.add_argument("--cache-type-v", default="F16", help="KV cache type for V (F16, F32)")


# llama.cpp's flag -> the SamplingParams field it sets; the default and help come from the field.
SAMPLING_FLAGS: dict[str, str] = {
    "--temp": "temperature", "--top-k": "top_k", "--top-p": "top_p", "--min-p": "min_p",
    "--typical": "typical_p", "--repeat-penalty": "repeat_penalty", "--repeat-last-n": "repeat_last_n",
    "--presence-penalty": "presence_penalty", "--frequency-penalty": "frequency_penalty",
    "--mirostat": "mirostat", "--mirostat-lr": "mirostat_eta", "--mirostat-ent": "mirostat_tau",
    "--seed": "seed",
}


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """Sampling flags named as llama.cpp names them, with SamplingParams' defaults."""
    from ggflow.core.sampling_params import SamplingParams

    fields = {f.name: f for f in dataclasses.fields(SamplingParams)}
    g = parser.add_argument_group("sampling")
    for flag, name in SAMPLING_FLAGS.items():
        f = fields[name]
        kind = int if f.default is None else type(f.default)  # seed: an int or None
        extra = {"choices": (0, 1, 2)} if name == "mirostat" else {}
        g.add_argument(flag, dest=name, type=kind, default=f.default,
                       help=f"{f.metadata.get('doc', name)} (default {f.default})", **extra)
    g.add_argument("--samplers", default=None,
                   help="sampler names in order, ';' separated (plugins' samplers too), replacing the default chain")


def sampling_params(args: argparse.Namespace):
    from ggflow.core.sampling_params import SamplingParams

    chosen = {name: getattr(args, name) for name in SAMPLING_FLAGS.values()}
    return SamplingParams(**chosen, samplers=args.samplers.split(";") if args.samplers else None)


def backend_names(spec: str) -> "str | list[str]":
    return spec if spec == "auto" else [s.strip() for s in spec.split(",") if s.strip()]


def load_llm(args: argparse.Namespace):
    from ggflow.api import LLM

    return LLM(args.model, backend=backend_names(args.backend), n_ctx=args.ctx_size, n_threads=args.threads,
               n_ubatch=args.ubatch_size, type_k=args.cache_type_k.upper(), type_v=args.cache_type_v.upper(),
               seed=getattr(args, "seed", None))
