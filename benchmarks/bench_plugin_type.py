"""Decode speed of a plugin quant type against a built-in one, with and without its CPU pieces.

    python benchmarks/bench_plugin_type.py [--model F32_OR_F16.gguf] [--type IQ4_NL] [--base Q4_0]
                                           [-n 64] [-r 5] [-t 1]

Quantizes the model (default: ../shared's tiny llama in F32) to the built-in base type and to the
plugin type (``examples/ggflow-example-plugin``'s IQ4_NL unless --type names another registered
type), then decodes n tokens with each, interleaved, r rounds: the base type; the plugin type through
its pieces (the packed skeleton); the plugin type with its pieces hidden, so the CPU converts its
weights once to F16. Prints medians of tokens/s and the ratios to the base type.

Hiding the pieces replaces ``quant_matmul.cpu_pieces`` in this process only: the no-pieces path is
otherwise only reachable with a plugin written without them.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO.parent / "shared" / "models" / "tiny-llama-hs-f32.gguf"
EXAMPLE_SRC = REPO / "examples" / "ggflow-example-plugin" / "src"


def ensure_type(name: str) -> None:
    from ggflow.core.types import type_traits
    from ggflow.errors import UnknownNameError
    try:
        type_traits(name)
    except UnknownNameError:     # not installed: register the example plugin from its source tree
        sys.path.insert(0, str(EXAMPLE_SRC))
        from ggflow_example_plugin import plugin
        from ggflow.plugins.manager import get_plugin_manager
        get_plugin_manager().register(plugin, "example")
        type_traits(name)


def decode_speed(path: str, n_gen: int, threads: int) -> float:
    from ggflow.core.batch import Batch
    from ggflow.core.context import Context
    from ggflow.core.model import Model
    model = Model.load(path)
    ctx = Context(model, n_ctx=max(256, n_gen + 1), n_threads=threads)
    token = 1

    def run() -> float:
        ctx.clear()
        t0 = time.perf_counter()
        for pos in range(n_gen):
            ctx.decode(Batch.from_tokens([token], pos0=pos))
        return n_gen / (time.perf_counter() - t0)
    run()                                   # warm-up: packs weights, compiles, builds the graph
    return run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="an F32 or F16 GGUF to quantize")
    ap.add_argument("--type", default="IQ4_NL", help="the plugin type")
    ap.add_argument("--base", default="Q4_0", help="the built-in type to compare with")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()

    ensure_type(args.type)
    from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
    from ggflow.quantize_model import quantize_model

    tmp = Path(tempfile.mkdtemp(prefix="ggflow-bench-type-"))
    files = {}
    for name in (args.base, args.type):
        files[name] = str(tmp / f"model-{name}.gguf")
        quantize_model(args.model, files[name], name, pure=True, progress=False)

    with_pieces = qmm.cpu_pieces

    def without_pieces(traits):
        return None if traits.name == args.type.upper() else with_pieces(traits)

    runs: dict[str, list[float]] = {args.base: [], f"{args.type} pieces": [], f"{args.type} as F16": []}
    for _ in range(args.rounds):
        runs[args.base].append(decode_speed(files[args.base], args.n_gen, args.threads))
        runs[f"{args.type} pieces"].append(decode_speed(files[args.type], args.n_gen, args.threads))
        qmm.cpu_pieces, qmm._QUANT_TYPES = without_pieces, {}
        try:
            runs[f"{args.type} as F16"].append(decode_speed(files[args.type], args.n_gen, args.threads))
        finally:
            qmm.cpu_pieces, qmm._QUANT_TYPES = with_pieces, {}

    base = statistics.median(runs[args.base])
    print(f"{Path(args.model).name}, tg{args.n_gen}, {args.threads} thread(s), medians of {args.rounds} rounds")
    for label, speeds in runs.items():
        med = statistics.median(speeds)
        print(f"  {label:<18} {med:9.1f} tok/s   {base / med:5.2f}x slower than {args.base}"
              f"   (runs: {', '.join(f'{s:.0f}' for s in speeds)})")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
