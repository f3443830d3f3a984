"""MXFP4 (quant_builtin/mxfp4.py): ggml's reference bytes and values, gguf-py's decoding, and its CPU matmul.

tests/data/mxfp4_ggml.npz holds ggml's own output (provenance in tests/data/README.md). The matmul is checked
against float64 products of the decoded weights with the activations rounded to Q8_0 as ggml rounds them:
every term is then exact in both, so only the float32 accumulation differs (rtol 1e-5 of the row's scale).
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import ggflow
from ggflow.backends_builtin.cpu.products import quant_matmul
from ggflow.core.types import type_traits
from ggflow.errors import QuantizationError

DATA = Path(__file__).resolve().parent / "data" / "mxfp4_ggml.npz"


@pytest.fixture(scope="module")
def golden():
    with np.load(DATA) as f:
        return {k: f[k] for k in f.files}


def test_quantize_matches_ggml_byte_for_byte(golden):
    np.testing.assert_array_equal(ggflow.quantize(golden["input"], "MXFP4"), golden["q"])


def test_dequantize_matches_ggml_bit_for_bit(golden):
    ours = ggflow.dequantize(golden["q"], "MXFP4")
    np.testing.assert_array_equal(ours.view(np.uint32), golden["dequantized"].view(np.uint32))


def test_every_scale_and_nibble_decodes_as_gguf_py():
    blocks = np.zeros((256, 17), np.uint8)
    blocks[:, 0] = np.arange(256)                           # every E8M0 scale, 255 (E8M0's NaN) included
    blocks[:, 1:] = np.arange(16, dtype=np.uint8) * 17      # every nibble, low and high
    with np.errstate(over="ignore"):
        theirs = gguf.quants.dequantize(blocks.reshape(-1), gguf.GGMLQuantizationType.MXFP4).reshape(256, 32)
    ours = ggflow.dequantize(blocks, "MXFP4")
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert np.isinf(ours[255]).any() and not np.isnan(ours).any()   # ggml: 2^127 * 12, no NaN


def test_traits_are_ggmls():
    t = type_traits("MXFP4")
    assert (t.type_id, t.block_size, t.type_size, t.vec_dot_type) == (39, 32, 17, "Q8_0")
    assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.MXFP4] == (t.block_size, t.type_size)


def test_non_finite_input_is_refused():
    x = np.ones((1, 32), np.float32)
    x[0, 3] = np.nan
    with pytest.raises(QuantizationError, match="MXFP4"):
        ggflow.quantize(x, "MXFP4")


def test_a_partial_block_is_refused_not_read_past():
    with pytest.raises(QuantizationError, match="MXFP4"):
        type_traits("MXFP4").to_float(np.zeros((2, 16), np.uint8))


@pytest.mark.parametrize("n_tokens", [1, 5, 40])
def test_cpu_matmul_is_ggmls_dot(n_tokens):
    rng = np.random.default_rng(39)
    rows, k = 70, 256
    w = ggflow.quantize(rng.standard_normal((rows, k)).astype(np.float32), "MXFP4")
    x = rng.standard_normal((n_tokens, k)).astype(np.float32)
    out = np.empty((n_tokens, rows), np.float32)
    quant_matmul.mul_mat(quant_matmul.pack_weight(w, "MXFP4"), x, out)
    x8 = ggflow.dequantize(ggflow.quantize(x, "Q8_0"), "Q8_0").astype(np.float64)
    want = x8 @ ggflow.dequantize(w, "MXFP4").astype(np.float64).T
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert quant_matmul.pack_weight(w, "MXFP4").kernel_type == "MXFP4"     # the packed kernel, not a conversion
