"""Options shared by the commands that load a model."""
from __future__ import annotations

import argparse
import dataclasses

from ggflow.cli.args import UsageError, int_at_least, model_file
from ggflow.process_heap import freeze_loaded_objects

KV_TYPES = ("F16", "F32")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    add_hub_option(parser)
    parser.add_argument("-c", "--ctx-size", type=int_at_least(0, "0: the model's training context"), default=2048,
                        help="context size in tokens; 0: the model's training context (default 2048)")
    parser.add_argument("-t", "--threads", type=int_at_least(1), default=None, help="CPU threads (default: all cores)")
    parser.add_argument("-b", "--ubatch-size", type=int_at_least(1), default=512, help="tokens per graph evaluation")
    parser.add_argument("--backend", default="auto", help="backend name(s), comma separated (default: auto)")
    parser.add_argument("--cache-type-k", type=str.upper, choices=KV_TYPES, default="F16", help="KV cache type for K")
    parser.add_argument("--cache-type-v", type=str.upper, choices=KV_TYPES, default="F16", help="KV cache type for V")
    parser.set_defaults(compiles_kernels=True)


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
    from ggflow.api.arguments import RANGES, cli_type
    from ggflow.core.sampling_params import SamplingParams

    fields = {f.name: f for f in dataclasses.fields(SamplingParams)}
    g = parser.add_argument_group("sampling")
    for flag, name in SAMPLING_FLAGS.items():
        f = fields[name]
        kind = int if f.default is None else type(f.default)  # seed: an int or None
        extra = {"choices": (0, 1, 2)} if name == "mirostat" else {}
        checked = cli_type(name, kind) if name in RANGES else kind   # the API's and the server's ranges
        g.add_argument(flag, dest=name, type=checked, default=f.default,
                       help=f"{f.metadata.get('doc', name)} (default {f.default})", **extra)
    g.add_argument("--samplers", default=None,
                   help="sampler names in order, ';' separated (plugins' samplers too), replacing the default "
                        "chain; a stage takes parameters as name:param=value,param=value (`ggflow plugins` "
                        "lists each sampler's)")
    g.add_argument("--sampler-param", action="append", default=[], metavar="NAME.PARAM=VALUE",
                   help="set a parameter of a stage in the chain (repeatable), e.g. top_k.k=20")


def sampling_params(args: argparse.Namespace):
    from ggflow.core.sampling_params import DEFAULT_SAMPLER_ORDER, SamplingParams
    from ggflow.core.sampling_stages import parse_samplers, with_sampler_params

    chosen = {name: getattr(args, name) for name in SAMPLING_FLAGS.values()}
    stages = parse_samplers(args.samplers) if args.samplers else None
    if getattr(args, "sampler_param", None):
        stages = with_sampler_params(DEFAULT_SAMPLER_ORDER if stages is None else stages, args.sampler_param)
    return SamplingParams(**chosen, samplers=stages)


def backend_names(spec: str) -> "str | list[str]":
    return spec if spec == "auto" else [s.strip() for s in spec.split(",") if s.strip()]


def model_path(args: argparse.Namespace) -> str:
    from ggflow.api import default_model_path

    if getattr(args, "hf_repo", None):
        return hub_model_path(args)
    return model_file(args.model) if args.model else default_model_path()


def add_hub_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-hf", "-hfr", "--hf-repo", default=None, metavar="USER/MODEL[:QUANT]",
                        help="a GGUF from the Hugging Face Hub, as llama.cpp's -hf: the file whose name has QUANT "
                             "(default Q4_K_M, then Q8_0, then the first); cached by huggingface_hub ($HF_TOKEN, "
                             "$HF_ENDPOINT, $HF_HUB_OFFLINE apply)")


def hub_model_path(args: argparse.Namespace) -> str:
    from ggflow.api.hub import resolve_hf

    if getattr(args, "model", None):
        raise UsageError("-m/--model and -hf/--hf-repo name two models: give one")
    return resolve_hf(args.hf_repo)


def context_size(path: str, requested: int, type_k: str, type_v: str) -> int:
    """-c as a number of cells: 0 is the model's training context; a cache that cannot fit in memory is refused
    here, in one line, rather than as a MemoryError from numpy."""
    from ggflow.core.gguf_file import GGUFFile
    from ggflow.core.model import Metadata
    from ggflow.api.memory_estimate import available_memory, estimate_context_memory
    from ggflow.plugins.manager import get_plugin_manager

    # The header alone (no tensor table, no merges): cheap next to the load that follows.
    fields = GGUFFile(path, keep=lambda key: key != "tokenizer.ggml.merges", tensors=False).fields
    meta = Metadata(fields, path)
    hp = get_plugin_manager().architectures.get(meta.arch).load_hparams(meta)
    n_ctx = requested or hp.n_ctx_train
    per_token = estimate_context_memory(hp, 1, 1, type_k, type_v).kv_bytes   # the KV cache grows with n_ctx
    free = available_memory()
    if free is not None and n_ctx * per_token > free:
        raise UsageError(f"-c/--ctx-size {requested}: a KV cache of {n_ctx} tokens needs "
                         f"{n_ctx * per_token / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB of memory "
                         f"available; accepted: 0 (the training context, {hp.n_ctx_train}) "
                         f"or 1..{free // per_token}")
    return n_ctx


def load_llm(args: argparse.Namespace):
    from ggflow.api import LLM

    path = model_path(args)
    n_ctx = context_size(path, args.ctx_size, args.cache_type_k, args.cache_type_v)
    llm = LLM(path, backend=backend_names(args.backend), n_ctx=n_ctx, n_threads=args.threads,
              n_ubatch=args.ubatch_size, type_k=args.cache_type_k, type_v=args.cache_type_v,
              seed=getattr(args, "seed", None))
    freeze_loaded_objects()
    return llm
