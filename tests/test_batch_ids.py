"""Token ids, positions and sequence ids are range-checked as given, before any cast to int32."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.batch import Batch, BatchError
from ggflow.core.context import Context
from ggflow.core.model import Model


@pytest.mark.parametrize("token", [2**32 + 5, 2**31, 2**64, 2**63, 2**100])
def test_a_token_id_beyond_32_bits_is_refused_naming_the_id_as_given(token):
    # a cast first made 2**32 + 5 token 5, and reported 2**31 as -2147483648
    with pytest.raises(BatchError, match=f"token id {token} at batch index 1 "):
        Batch.from_tokens([3, token])


def test_a_numpy_array_of_huge_ids_is_refused_too():
    with pytest.raises(BatchError, match=f"token id {2**32 + 5} at batch index 0"):
        Batch.from_tokens(np.array([2**32 + 5, 1], dtype=np.uint64))


def test_mixed_ids_numpy_would_turn_into_floats_are_checked_exactly():
    with pytest.raises(BatchError, match=f"token id {2**63} at batch index 2"):
        Batch.from_tokens([1, 2, 2**63, -1])


@pytest.mark.parametrize("token", [1.5, "7", None])
def test_a_token_id_that_is_not_an_integer_is_refused(token):
    with pytest.raises(BatchError, match="is not an integer"):
        Batch.from_tokens([1, token])


def test_positions_and_sequence_ids_beyond_32_bits_are_refused():
    with pytest.raises(BatchError, match=f"position {2**32} at batch index 1"):
        Batch(np.array([1, 2]), np.array([0, 2**32]), 0, True)
    with pytest.raises(BatchError, match=f"sequence id {2**32}"):
        Batch(np.array([1, 2]), np.array([0, 1]), 2**32, True)


def test_ids_in_range_keep_their_values():
    b = Batch.from_tokens([0, 2**31 - 1, 5])
    assert b.tokens.dtype == np.int32 and b.tokens.tolist() == [0, 2**31 - 1, 5]


def test_a_negative_id_is_refused_at_decode_naming_it(tiny_model_path):
    ctx = Context(Model.load(tiny_model_path("llama")), n_ctx=16, backends="cpu")
    with pytest.raises(BatchError, match=r"token id -1 at batch index 1 is outside the vocabulary"):
        ctx.decode(Batch.from_tokens([5, -1]))
