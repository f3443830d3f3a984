"""Encoders given importance weights, byte for byte with ggml (ggml_quantize_chunk with an imatrix row).

tests/data/quant_kq_imatrix_ggml_seed1.npz holds ggml's own output of quantize_<type>(input, out, 48, 1024,
quant_weights) for the 48 golden rows (tests/data/README.md); ``.chunk`` the same calls without weights.
ggflow.quantize(rows, type, quant_weights) must write those bytes where ggflow has the weighted encoder;
the others must refuse weights rather than ignore them silently (the quantize pipeline then reports the
tensor as quantized without its weights).
"""
from __future__ import annotations

import numpy as np
import pytest

import ggflow
from ggflow.core.quants import takes_importance
from ggflow.errors import QuantizationError
from tests.data_dir import DATA

GOLDEN = np.load(DATA / "quant_kq_imatrix_ggml_seed1.npz")
ROWS = np.load(DATA / "golden" / "quant_ggml_seed1.npz")["input"]
WITH_CHUNK = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ3_S", "IQ3_XXS", "IQ2_S")
WEIGHTED = WITH_CHUNK + ("IQ2_XXS", "IQ2_XS", "IQ1_S")   # ggml requires the weights for these (no .chunk data)
NOT_YET = ("Q8_K", "IQ1_M")   # Q8_K: no weighted ggml encoder; IQ1_M: no encoder at all yet


def differing_blocks(ours: np.ndarray, ref: np.ndarray, type_size: int) -> np.ndarray:
    return np.flatnonzero((ours.reshape(-1, type_size) != ref.reshape(-1, type_size)).any(axis=1))


@pytest.mark.parametrize("name", WEIGHTED)
def test_weighted_encoder_writes_ggml_s_bytes(name):
    t = ggflow.core.types.type_traits(name)
    ours = ggflow.quantize(ROWS, name, GOLDEN["quant_weights"])
    bad = differing_blocks(ours, GOLDEN[f"{name}.imatrix"], t.type_size)
    assert bad.size == 0, f"{bad.size} blocks differ, first {bad[:5]}"
    assert takes_importance(name)


@pytest.mark.parametrize("name", WITH_CHUNK)
def test_without_weights_it_is_ggml_s_chunk_quantizer(name):
    np.testing.assert_array_equal(ggflow.quantize(ROWS, name), GOLDEN[f"{name}.chunk"])


@pytest.mark.parametrize("name", ("IQ2_XXS", "IQ2_XS", "IQ1_S"))
def test_iq2_types_need_the_weights(name):
    with pytest.raises(QuantizationError, match=f"{name} needs importance weights"):
        ggflow.quantize(ROWS[:1], name)


@pytest.mark.parametrize("name", WITH_CHUNK)
def test_the_weights_matter(name):
    """A weak-test guard: ggml's weighted bytes differ from its unweighted ones on most rows."""
    differ = (GOLDEN[f"{name}.imatrix"] != GOLDEN[f"{name}.chunk"]).any(axis=1)
    assert differ.mean() > 0.5


@pytest.mark.parametrize("name", NOT_YET)
def test_types_without_a_weighted_encoder_refuse_weights(name):
    assert not takes_importance(name)
    with pytest.raises(QuantizationError, match="takes no importance weights|no quantizer"):
        ggflow.quantize(ROWS[:1], name, GOLDEN["quant_weights"])


def test_legacy_weights_need_the_row_length():
    """ggml weighs a legacy block by its row's mean square: the encoder refuses weights without the row."""
    from ggflow.core.types import type_traits
    blocks = ROWS[:2].reshape(-1, 32)
    qw = np.tile(GOLDEN["quant_weights"], 2).reshape(-1, 32)
    with pytest.raises(QuantizationError, match="row length"):
        type_traits("Q4_0").from_float(blocks, quant_weights=qw)
    whole = type_traits("Q4_0").from_float(blocks, quant_weights=qw, n_per_row=1024)
    np.testing.assert_array_equal(whole.reshape(2, -1), GOLDEN["Q4_0.imatrix"][:2])


def test_weights_must_match_the_row():
    with pytest.raises(QuantizationError, match="512 importance weights for rows of 1024"):
        ggflow.quantize(ROWS[:1], "Q4_K", GOLDEN["quant_weights"][:512])
