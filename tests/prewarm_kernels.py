"""Compile the kernels the suite needs into numba's on-disk cache, from a second process.

From an empty cache the suite spends about half its time in numba compiling, on one core: numba compiles
single-threaded and the tests wait for it (docs/performance.md, "Compile time of the parallel drivers").
conftest.py starts this script beside a whole-suite run, at low priority, so the idle core compiles ahead:
the default model's kernels first (the first model tests need them), a tiny model's, then each weight
type's matmul drivers in the order tests/test_cpu_quant_matmul.py meets them. A test loads what this has
cached by then and compiles the rest itself; results do not depend on it (numba writes each cache file
whole, by rename).

    python -m tests.prewarm_kernels
"""
from __future__ import annotations

import os

import numpy as np

# the order tests/test_cpu_quant_matmul.py first meets the types in
WEIGHT_TYPES = ["Q4_0", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_1", "Q5_1", "F16", "BF16", "F32"]


def default_model() -> None:
    from ggflow.api import default_model_path
    from ggflow.cli import main
    from ggflow.errors import GGFlowError
    try:
        path = default_model_path()
    except GGFlowError:   # the model package is not installed: the model tests skip, nothing to warm
        return
    main(["warmup", "-m", str(path)])


def tiny_model() -> None:
    """A tiny llama in F32 (the architecture tests' kind): its F32 products and attention."""
    import tempfile

    from ggflow.cli import main
    from tests.fixtures.tiny_models import write_tiny_model
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "llama-F32.gguf")
        write_tiny_model(path, "llama", "F32")
        main(["warmup", "-m", path])


def weight_type(w_type: str) -> None:
    """Every driver of one type's matmul: serial and parallel, each batch path it has (pairs: serial, as
    the tests run it)."""
    import ggflow
    from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
    from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
    from ggflow.backends_builtin.cpu.products.qmm.amx import amx_available
    from ggflow.backends_builtin.cpu.products.qmm.quads import quads_are_exact
    from ggflow.core.types import type_traits

    w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    # packed as the tests pack theirs (the same signatures); 64 rows take a K-quant encoder's parallel
    # driver on two threads, one row its serial one
    pw = qmm.pack_weight(ggflow.quantize(w, w_type), w_type)
    ggflow.quantize(w[:1], w_type)
    if not type_traits(w_type).is_quantized:
        for parallel in (False, True):
            pw.drivers.get(parallel)
        return
    pieces = qmm.cpu_pieces(type_traits(w_type))
    paths = ["tile", "quads"] if pieces.decode_quads and quads_are_exact(pieces.quad_bias) else ["tile"]
    if tmpl.amx_takes(pieces) and amx_available():
        paths.append("amx")
    for path in paths:
        for parallel in (False, True):
            pw.drivers.get(parallel, path)
    pw.drivers.get(False, "pairs")


def main() -> None:
    if hasattr(os, "nice"):
        os.nice(10)   # the tests come first: this takes what CPU they leave
    default_model()
    tiny_model()
    for w_type in WEIGHT_TYPES:
        weight_type(w_type)


if __name__ == "__main__":
    main()
