"""The CPU backend's numba row decoders (ops/row_decoders.py) give the type's own to_float, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.ops import row_decoders
from ggflow.core.quants import quantize
from ggflow.core.types import type_traits

rng = np.random.default_rng(5)


def random_rows(traits, n_rows, n_blocks):
    """Rows of blocks with random bytes: every pattern is a block, so the scales include subnormal and NaN halves
    (infinite ones set in the first rows), and two rows quantized from random floats."""
    raw = rng.integers(0, 256, (n_rows, n_blocks * traits.type_size), dtype=np.uint8)
    for row, half in enumerate((0x7C00, 0xFC00, 0x0001, 0x8001, 0x7E00)):   # d = +-inf, +-subnormal, NaN
        raw[row, :2] = (half & 0xFF, half >> 8)
    values = (rng.standard_normal((2, n_blocks * traits.block_size)) * 3).astype(np.float32)
    return np.concatenate([raw, quantize(values, traits.name).reshape(2, -1)])


@pytest.mark.parametrize("name", sorted(row_decoders.DECODERS))
def test_a_decoded_row_is_the_types_to_float_bit_for_bit(name):
    traits = type_traits(name)
    raw = random_rows(traits, 300, 6)
    out = np.full((raw.shape[0], 6 * traits.block_size), -1.0, np.float32)
    decode = row_decoders.bind_decoder(traits, raw, out)
    assert decode is not None
    with np.errstate(invalid="ignore"):
        expected = np.asarray(traits.to_float(raw.reshape(-1, traits.type_size)), np.float32).reshape(out.shape)
    decode()
    assert np.isnan(expected).any() and np.isinf(expected).any()        # the edge scales were there
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(out[finite].view(np.uint32), expected[finite].view(np.uint32))


def test_other_types_and_other_layouts_keep_to_float():
    q4_k, q8_0 = type_traits("Q4_K"), type_traits("Q8_0")
    out = np.empty((1, 256), np.float32)
    assert row_decoders.bind_decoder(q4_k, np.zeros((1, q4_k.type_size), np.uint8), out) is None
    raw = np.zeros((1, 8 * 34), np.uint8)
    assert row_decoders.bind_decoder(q8_0, raw, out) is not None
    assert row_decoders.bind_decoder(q8_0, raw, np.empty((1, 256), np.float64)) is None       # not float32
    assert row_decoders.bind_decoder(q8_0, raw[:, :-34], out) is None                         # a short row
    assert row_decoders.bind_decoder(q8_0, raw, np.empty((2, 512), np.float32)[:1, ::2]) is None   # strided
