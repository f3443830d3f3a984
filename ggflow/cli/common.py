"""Options shared by the commands that load a model."""
from __future__ import annotations

import argparse


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("-c", "--ctx-size", type=int, default=2048, help="context size in tokens (default 2048)")
    parser.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    parser.add_argument("-b", "--ubatch-size", type=int, default=512, help="tokens per graph evaluation")
    parser.add_argument("--backend", default="auto", help="backend name(s), comma separated (default: auto)")
    parser.add_argument("--cache-type-k", default="F16", help="KV cache type for K (F16, F32)")
    parser.add_argument("--cache-type-v", default="F16", help="KV cache type for V (F16, F32)")


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """Sampling flags named as llama.cpp names them."""
    g = parser.add_argument_group("sampling")
    g.add_argument("--temp", type=float, default=0.8, help="temperature; <= 0 is greedy (default 0.8)")
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--min-p", type=float, default=0.05)
    g.add_argument("--typical", type=float, default=1.0)
    g.add_argument("--repeat-penalty", type=float, default=1.0)
    g.add_argument("--repeat-last-n", type=int, default=64)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--mirostat", type=int, default=0, choices=(0, 1, 2))
    g.add_argument("--mirostat-lr", type=float, default=0.1)
    g.add_argument("--mirostat-ent", type=float, default=5.0)
    g.add_argument("--seed", type=int, default=None, help="RNG seed (default: random)")
    g.add_argument("--samplers", default=None,
                   help="sampler names in order, ';' separated (plugins' samplers too), replacing the default chain")


def sampling_params(args: argparse.Namespace):
    from ggflow.core.sampling import SamplingParams

    return SamplingParams(
        temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, typical_p=args.typical,
        repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        mirostat=args.mirostat, mirostat_eta=args.mirostat_lr, mirostat_tau=args.mirostat_ent, seed=args.seed,
        samplers=args.samplers.split(";") if args.samplers else None)


def backend_names(spec: str) -> "str | list[str]":
    return spec if spec == "auto" else [s.strip() for s in spec.split(",") if s.strip()]


def load_llm(args: argparse.Namespace):
    from ggflow.api import LLM

    return LLM(args.model, backend=backend_names(args.backend), n_ctx=args.ctx_size, n_threads=args.threads,
               n_ubatch=args.ubatch_size, type_k=args.cache_type_k.upper(), type_v=args.cache_type_v.upper(),
               seed=getattr(args, "seed", None))
