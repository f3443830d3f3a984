"""A plugin quant type reaches the CPU's matmul skeleton: the example plugin's IQ4_NL with its pieces,
a type with no pieces converted once, bad pieces refused, and the skeleton's kernels cached on disk.

References: gguf-py's IQ4_NL decoder (not ours) for the format; for the products, the exact integer dot
ggml forms (the weights as gguf decodes them times the Q8_0 activations, in float64), within the f32
accumulation slack of test_cpu_quant_matmul.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

import ggflow
from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
from ggflow.plugins.cpu_pieces import BlockPieces
from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import BackendError
from ggflow.plugins import hookimpl
from ggflow.plugins.manager import get_plugin_manager
from tests.data_dir import DATA

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_SRC = REPO / "examples" / "ggflow-example-plugin" / "src"
TINY_F32 = DATA / "models" / "tiny-llama-hs-f32.gguf"
U = 2.0 ** -24


@pytest.fixture
def iq4_nl(monkeypatch):
    """The example plugin's IQ4_NL, registered from its source tree for one test."""
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    from ggflow_example_plugin import plugin
    manager = get_plugin_manager()
    manager.register(plugin, "example")
    try:
        yield type_traits("IQ4_NL")
    finally:
        manager.unregister(plugin)


class _OnePlugin:
    def __init__(self, traits: TypeTraits):
        self.traits = traits

    @hookimpl
    def register_quant_types(self, register):
        register(self.traits)


@pytest.fixture
def register_type():
    manager, added = get_plugin_manager(), []

    def register(traits: TypeTraits) -> TypeTraits:
        plugin = _OnePlugin(traits)
        manager.register(plugin)
        added.append(plugin)
        return type_traits(traits.name)
    yield register
    for plugin in added:
        manager.unregister(plugin)


def weights(rows: int, k: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)


def gguf_iq4_nl(q: np.ndarray, rows: int, k: int) -> np.ndarray:
    return gguf_dequantize(q, gguf.GGMLQuantizationType.IQ4_NL).reshape(rows, k).astype(np.float64)


def run(pw, x: np.ndarray) -> np.ndarray:
    out = np.full((x.shape[0], pw.rows), np.nan, np.float32)
    qmm.mul_mat(pw, x, out)
    return out


def accumulation_slack(terms: np.ndarray, x: np.ndarray, n_adds: int) -> np.ndarray:
    """|f32 sum - exact| <= n_adds * u * sum |terms|, with a little room for the scale products."""
    return (n_adds + 4) * U * (np.abs(x).astype(np.float64) @ np.abs(terms).T) + 1e-30


# -- the format, against gguf-py ------------------------------------------------------------------
def test_iq4_nl_decoder_matches_gguf(iq4_nl):
    q = ggflow.quantize(weights(8, 256), "IQ4_NL")
    ours = iq4_nl.to_float(q.reshape(-1, iq4_nl.type_size)).reshape(8, 256)
    np.testing.assert_array_equal(ours, gguf_iq4_nl(q, 8, 256))


def test_iq4_nl_encoder_picks_the_nearest_table_value(iq4_nl):
    x = weights(16, 64, seed=1)
    q = ggflow.quantize(x, "IQ4_NL")
    blocks = q.reshape(-1, iq4_nl.type_size)
    d = np.abs(blocks[:, :2].copy().view(np.float16).astype(np.float64))          # (blocks, 1)
    err = np.abs(gguf_iq4_nl(q, 16, 64) - x).reshape(-1, 32)
    # the widest gap of the table is 24 (89 -> 113): half of it times d, plus the f16 rounding of d
    assert np.all(err <= 12 * d + 2.0 ** -10 * np.abs(x).reshape(-1, 32) + 1e-6)


# -- the packed kernels through the pieces -------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 9])
def test_iq4_nl_matmul_is_ggmls_integer_dot(iq4_nl, n):
    rows, k = 70, 256
    q = ggflow.quantize(weights(rows, k, seed=2), "IQ4_NL")
    pw = qmm.pack_weight(q, "IQ4_NL")
    assert (pw.kernel_type, pw.vec_dot_type) == ("IQ4_NL", "Q8_0")
    x = weights(n, k, seed=3)
    got = run(pw, x)
    xq, dx, _ = qmm.quantize_activations(x, "Q8_0")
    xd = xq * np.repeat(dx.astype(np.float64), 32, axis=1)
    wd = gguf_iq4_nl(q, rows, k)
    want = xd @ wd.T
    assert np.all(np.abs(got - want) <= accumulation_slack(wd, xd, k // 16 + 8))


def test_iq4_nl_batched_path_gives_the_matvec_results_bit_for_bit(iq4_nl):
    q = ggflow.quantize(weights(130, 128, seed=4), "IQ4_NL")
    pw = qmm.pack_weight(q, "IQ4_NL")
    x = weights(9, 128, seed=5)
    np.testing.assert_array_equal(run(pw, x), np.concatenate([run(pw, x[i:i + 1]) for i in range(9)]))


def test_iq4_nl_parallel_and_serial_kernels_agree(iq4_nl):
    rows, k = 520, 2048                       # over PARALLEL_MIN_MACS for one token
    pw = qmm.pack_weight(ggflow.quantize(weights(rows, k, seed=6), "IQ4_NL"), "IQ4_NL")
    x = weights(1, k, seed=7)
    act = qmm.quantize_activations(x, "Q8_0")
    a, b = np.empty((1, rows), np.float32), np.empty((1, rows), np.float32)
    pw.parallel(pw.kind, pw.arrays, *act, a)
    pw.serial(pw.kind, pw.arrays, *act, b)
    np.testing.assert_array_equal(a, b)


def test_prefetching_ahead_leaves_the_results_bit_for_bit(iq4_nl, register_type):
    """prefetch_bytes only asks for memory early (qmm.prefetch): the same pieces with it give the same bits,
    near the end of the weight too, where the blocks ahead are past its arrays and nothing is asked for."""
    pieces = dataclasses.replace(iq4_nl.kernels["cpu"], prefetch_bytes=300)
    traits = register_type(dataclasses.replace(iq4_nl, name="IQ4_PREFETCH", type_id=9203, kernels={"cpu": pieces}))
    q = ggflow.quantize(weights(130, 256, seed=10), "IQ4_NL")
    plain, ahead = qmm.pack_weight(q, "IQ4_NL"), qmm.pack_weight(q, traits.name)
    assert ahead.kind != plain.kind
    for n in (1, 9):
        x = weights(n, 256, seed=11)
        np.testing.assert_array_equal(run(ahead, x), run(plain, x))


def test_a_negative_prefetch_distance_is_refused(iq4_nl):
    with pytest.raises(ValueError, match="prefetch_bytes=-1"):
        dataclasses.replace(iq4_nl.kernels["cpu"], prefetch_bytes=-1)


def test_a_model_in_the_plugin_type_runs_in_a_context(iq4_nl, tmp_path):
    """The tiny llama quantized to IQ4_NL decodes through the pieces; its logits stay near the F32
    model's (4-bit weights: the tolerance is the spread Q4_0 shows on the same model, not ours to pick)."""
    from ggflow.core.batch import Batch
    from ggflow.core.context import Context
    from ggflow.core.model import Model
    from ggflow.quantize_model import quantize_model

    def logits(path) -> np.ndarray:
        ctx = Context(Model.load(str(path)), n_ctx=64)
        assert ctx.decode(Batch.from_tokens([1, 5, 9, 14, 2], all_logits=True)) == 0
        return ctx.get_logits().copy()

    for name in ("IQ4_NL", "Q4_0"):
        quantize_model(TINY_F32, tmp_path / f"{name}.gguf", name, pure=True, progress=False)
    reference = logits(TINY_F32)
    iq4, q4 = logits(tmp_path / "IQ4_NL.gguf"), logits(tmp_path / "Q4_0.gguf")
    assert np.all(np.isfinite(iq4))
    assert np.abs(iq4 - reference).max() <= 2 * np.abs(q4 - reference).max()


# -- a type without pieces -------------------------------------------------------------------------
def _plain(iq4: TypeTraits, name: str, type_id: int, vec_dot_type: str) -> TypeTraits:
    return dataclasses.replace(iq4, name=name, type_id=type_id, vec_dot_type=vec_dot_type, kernels={})


@pytest.mark.parametrize("vec_dot_type, kernel_type, rel", [("Q8_0", "F16", 2.0 ** -11), ("F32", "F32", 0.0)])
def test_a_type_without_pieces_is_converted_once(iq4_nl, register_type, vec_dot_type, kernel_type, rel):
    traits = register_type(_plain(iq4_nl, f"IQ4_PLAIN_{vec_dot_type}", 9100 + len(vec_dot_type), vec_dot_type))
    rows, k = 40, 128
    q = ggflow.quantize(weights(rows, k, seed=8), traits)
    pw = qmm.pack_weight(q, traits.name)
    assert (pw.w_type, pw.kernel_type) == (traits.name, kernel_type)
    assert pw.nbytes == rows * k * (2 if kernel_type == "F16" else 4)     # the stated memory cost
    x = weights(3, k, seed=9)
    wd = gguf_iq4_nl(q, rows, k)
    exact = x.astype(np.float64) @ wd.T
    # weights and activations rounded to F16 (rel 2**-11 each) or not at all, then the f32 sums
    bound = 2 * rel * np.abs(x).astype(np.float64) @ np.abs(wd).T + accumulation_slack(wd, x, k) + 2 * U
    assert np.all(np.abs(run(pw, x) - exact) <= bound)


# -- refused -----------------------------------------------------------------------------------------
def test_pieces_that_are_not_block_pieces_are_refused(iq4_nl, register_type):
    traits = register_type(dataclasses.replace(iq4_nl, name="IQ4_BAD", type_id=9201, kernels={"cpu": object()}))
    with pytest.raises(BackendError, match="BlockPieces"):
        qmm.pack_weight(ggflow.quantize(weights(2, 32), traits), traits.name)


def test_pieces_for_another_block_size_are_refused(iq4_nl, register_type):
    pieces = dataclasses.replace(iq4_nl.kernels["cpu"], block_size=64, groups=16)
    traits = register_type(dataclasses.replace(iq4_nl, name="IQ4_BAD64", type_id=9202, kernels={"cpu": pieces}))
    with pytest.raises(BackendError, match="64 elements"):
        qmm.pack_weight(ggflow.quantize(weights(2, 64), traits), traits.name)


def test_an_accumulate_for_block_quads_without_block_quads_is_refused(iq4_nl):
    pieces = iq4_nl.kernels["cpu"]
    assert pieces.block_quads is None
    with pytest.raises(ValueError, match="accumulate_block_quads needs block_quads"):
        dataclasses.replace(pieces, accumulate_block_quads=pieces.accumulate)


def test_group_counts_that_do_not_divide_the_block_are_refused(iq4_nl):
    with pytest.raises(ValueError, match="groups=3"):
        dataclasses.replace(iq4_nl.kernels["cpu"], groups=3)


# -- compiled once, cached ---------------------------------------------------------------------------
def test_editing_a_pieces_file_changes_its_kernel_key(tmp_path, monkeypatch):
    """numba's cache only checks the skeleton's own file: the key must follow the pieces' sources."""
    source = tmp_path / "throwaway_pieces.py"
    source.write_text("def piece(w):\n    return w\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import throwaway_pieces
    pieces = BlockPieces(32, 2, throwaway_pieces.piece, throwaway_pieces.piece, throwaway_pieces.piece,
                         throwaway_pieces.piece)
    before = tmpl.kind_key("T", pieces)
    assert tmpl.kind_key("T", pieces) == before
    source.write_text("def piece(w):\n    return w  # edited\n")
    os.utime(source, ns=(os.stat(source).st_atime_ns, os.stat(source).st_mtime_ns + 10**9))
    assert tmpl.kind_key("T", pieces) != before


def test_editing_a_module_the_skeleton_compiles_in_changes_every_kernel_key(tmp_path, monkeypatch):
    """The skeleton inlines helpers from other modules (qmm.prefetch's intrinsic, the quads' and pairs' sums):
    an edit there must not leave kernels compiled with the old helper in numba's cache."""
    helper = tmp_path / "skeleton_helper.py"
    helper.write_text("X = 1\n")
    monkeypatch.setattr(tmpl, "_SKELETON_FILES", (str(helper),))
    pieces = qmm.cpu_pieces(type_traits("Q4_0"))
    before = tmpl.kind_key("Q4_0", pieces)
    assert tmpl.kind_key("Q4_0", pieces) == before
    os.utime(helper, ns=(os.stat(helper).st_atime_ns, os.stat(helper).st_mtime_ns + 10**9))
    assert tmpl.kind_key("Q4_0", pieces) != before


def test_skeleton_kernels_load_from_numbas_cache_in_a_new_process():
    """Compile (or load) Q4_0's and IQ4_NL's serial kernels in one process (Q4_0's one token runs the quads
    driver: its block_quads); a second process must load both from the on-disk cache and compile none (the
    cost a factory of closures pays on every run)."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(EXAMPLE_SRC)!r})
        import numpy as np, ggflow
        from ggflow.plugins.manager import get_plugin_manager
        from ggflow_example_plugin import plugin
        get_plugin_manager().register(plugin, "example")
        from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
        from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
        w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
        for t in ("Q4_0", "IQ4_NL"):   # a small product: each type's serial driver
            qmm.mul_mat(qmm.pack_weight(ggflow.quantize(w, t), t), w[:1], np.empty((1, 64), np.float32))
        drivers = (tmpl._mul_mat_parallel, tmpl._mul_mat_serial,               # IQ4_NL's one token: the tile
                   tmpl._mul_mat_quads_parallel, tmpl._mul_mat_quads_serial)   # Q4_0's: its quads in place
        hits = sum(sum(d.stats.cache_hits.values()) for d in drivers)
        misses = sum(sum(d.stats.cache_misses.values()) for d in drivers)
        print(hits, misses)
    """)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=env)
            for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr[-2000:]
    hits, misses = map(int, runs[1].stdout.split())
    assert (hits, misses) == (2, 0)
