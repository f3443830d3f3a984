"""The byte-quad batched matmul: qmm.quads.quad_sums against numpy, and each type's decode_quads
against its decode (the same values plus the type's quad_bias, four elements of a row to a 32-bit lane)."""
import numpy as np
import pytest
from numba import njit

import ggflow
from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
from ggflow.backends_builtin.cpu.products.qmm.quads import quad_sums, quads_add_in_int32, quads_are_exact, word_quad_sums
from ggflow.plugins.cpu_pieces import BlockPieces
from ggflow.core.types import type_traits

ROWS = 64
QUAD_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@njit(cache=True)
def _run(wq, x8, i0, o, nquads, part, groups, ntok, xs, biased):
    for g in range(groups):
        if ntok == 2 and biased:
            quad_sums(wq, x8, i0, 2, o, g * nquads, nquads, part, g, ROWS, xs, o // (4 * nquads) + g, 32)
        elif ntok == 2:
            quad_sums(wq, x8, i0, 2, o, g * nquads, nquads, part, g, ROWS, xs, 0, 0)
        elif biased:
            quad_sums(wq, x8, i0, 1, o, g * nquads, nquads, part, g, ROWS, xs, o // (4 * nquads) + g, 32)
        else:
            quad_sums(wq, x8, i0, 1, o, g * nquads, nquads, part, g, ROWS, xs, 0, 0)


def _as_quads(wd: np.ndarray) -> np.ndarray:
    """(elements, rows) small non-negative values -> (elements // 4, rows) int32 lanes of four bytes."""
    b = wd.astype(np.uint8).reshape(-1, 4, wd.shape[1])                 # [quad, h, row]
    return np.ascontiguousarray(b.transpose(0, 2, 1)).view(np.int32)[..., 0]


# the pieces' contract: a group's products summed in absolute value fit int16 (|x| <= 128)
@pytest.mark.parametrize("ntok", [1, 2])
@pytest.mark.parametrize("gsize, top", [(4, 63), (8, 31), (16, 15), (16, 3)])
def test_quad_sums_are_the_exact_group_sums(ntok, gsize, top):
    rng = np.random.default_rng(gsize * 100 + top + ntok)
    qk, n, o, i0 = 32, 5, 32, 2
    wd = rng.integers(0, top + 1, (qk, ROWS))
    wd[:, 0] = top                                             # a row at the contract's bound
    x = rng.integers(-128, 128, (n, 3 * qk)).astype(np.int8)
    x[i0:i0 + ntok, o:o + qk] = -128                           # ... against the most negative activations
    x[i0, o + 1] = 127
    part = np.full((ntok, qk // gsize, ROWS), 12345, np.int32)
    _run(_as_quads(wd), x, i0, o, gsize // 4, part, qk // gsize, ntok, np.zeros((1, 1), np.int32), False)
    for u in range(ntok):
        prod = wd * x[i0 + u, o:o + qk].astype(np.int64)[:, None]
        np.testing.assert_array_equal(part[u], prod.reshape(qk // gsize, gsize, ROWS).sum(axis=1))


@pytest.mark.parametrize("ntok", [1, 2])
def test_a_quad_bias_comes_out_through_the_activation_sums(ntok):
    """Q6_K's layout: values -32..31 stored as 0..63, groups of 8; activations down to -128 (Q8_K's)."""
    rng = np.random.default_rng(ntok)
    qk, gsize, n, o, i0 = 32, 8, 4, 32, 1
    q = rng.integers(-32, 32, (qk, ROWS))
    q[:, 0] = -32
    x = rng.integers(-128, 128, (n, 3 * qk)).astype(np.int8)
    x[i0:i0 + ntok, o:o + qk:3] = -128
    xs = x.astype(np.int64).reshape(n, -1, gsize).sum(axis=2).astype(np.int32)    # every group's sum
    part = np.full((ntok, qk // gsize, ROWS), 12345, np.int32)
    _run(_as_quads(q + 32), x, i0, o, gsize // 4, part, qk // gsize, ntok, xs, True)
    for u in range(ntok):
        prod = q * x[i0 + u, o:o + qk].astype(np.int64)[:, None]
        np.testing.assert_array_equal(part[u], prod.reshape(qk // gsize, gsize, ROWS).sum(axis=1))


def _decoded(pieces, w, nb):
    """decode and decode_quads of every block of tile 0, run as the skeleton runs them."""
    qk = pieces.block_size
    decode, decode_quads = pieces.decode, pieces.decode_quads

    @njit
    def both(w):
        wd = np.empty((nb, qk, ROWS), np.int16)
        wq = np.empty((nb, qk // 4, ROWS), np.int32)
        for b in range(nb):
            decode(w, 0, b, wd[b])
            decode_quads(w, 0, b, wq[b])
        return wd, wq
    return both(w)


@pytest.mark.parametrize("w_type", QUAD_TYPES)
def test_decode_quads_holds_the_decoded_values_four_to_a_lane(w_type):
    traits = type_traits(w_type)
    k = 2 * traits.block_size
    q = ggflow.quantize(np.random.default_rng(3).standard_normal((ROWS, k)).astype(np.float32), w_type)
    pieces = qmm.cpu_pieces(traits)
    w = pieces.pack(q, ROWS, k)
    wd, wq = _decoded(pieces, w, k // traits.block_size)
    stored = wd + pieces.quad_bias
    assert stored.min() >= 0 and stored.max() <= 63     # unsigned bytes, half a group's products within int16
    for b in range(wd.shape[0]):
        np.testing.assert_array_equal(wq[b], _as_quads(stored[b]))


def test_decode_quads_needs_groups_of_whole_quads():
    pieces = qmm.cpu_pieces(type_traits("Q4_0"))
    with pytest.raises(ValueError, match="multiple of 4"):
        BlockPieces(32, 16, pieces.pack, pieces.block_sums, pieces.decode, pieces.accumulate, pieces.decode_quads)
    with pytest.raises(ValueError, match="quads_from"):
        BlockPieces(32, 2, pieces.pack, pieces.block_sums, pieces.decode, pieces.accumulate, pieces.decode_quads,
                    quads_from=0)
    with pytest.raises(ValueError, match="quad_bias"):
        BlockPieces(32, 2, pieces.pack, pieces.block_sums, pieces.decode, pieces.accumulate, pieces.decode_quads,
                    quad_bias=129)
    with pytest.raises(ValueError, match="quad_groups"):
        BlockPieces(32, 2, pieces.pack, pieces.block_sums, pieces.decode, pieces.accumulate, pieces.decode_quads,
                    quad_groups=3)


# the largest value each type's decode_quads stores (its bits, bias included: Q6_K's -32..31 as 0..63)
STORED_MAX = {"Q4_0": 15, "Q4_1": 15, "Q5_0": 31, "Q5_1": 31, "Q2_K": 3, "Q3_K": 7, "Q4_K": 15, "Q5_K": 31, "Q6_K": 63}


@pytest.mark.parametrize("w_type", QUAD_TYPES)
def test_the_quads_sum_groups_whose_half_fits_int16_where_they_add_in_int16(w_type):
    """On AVX2 (no VNNI) quad_sums holds half a group's products in an int16 lane: the groups the quads sum there
    (Q5_K's and Q6_K's bigger quad_groups only where they add in int32) must keep that half within int16."""
    pieces = qmm.cpu_pieces(type_traits(w_type))
    for int32_sums in (False, True):
        qgroups, accumulate, read = tmpl.quad_plan(pieces, int32_sums)
        assert pieces.block_size % (4 * qgroups) == 0 and read >= qgroups
        assert accumulate in (pieces.accumulate, pieces.accumulate_quads)
        if not int32_sums:
            assert pieces.block_size // qgroups // 2 * STORED_MAX[w_type] * 128 < 2 ** 15


def test_quad_groups_int32_needs_groups_of_whole_quads_to_fall_back_on():
    pieces = qmm.cpu_pieces(type_traits("Q8_0"))    # 2-element groups
    with pytest.raises(ValueError, match="quad_groups_int32"):
        BlockPieces(32, 16, pieces.pack, pieces.block_sums, pieces.decode, pieces.accumulate, pieces.decode_quads,
                    quad_groups=1, accumulate_quads=pieces.accumulate_quads, quad_groups_int32=True)


BLOCK_QUAD_TYPES = [t for t in QUAD_TYPES + ["Q8_0"] if qmm.cpu_pieces(type_traits(t)).block_quads is not None]


def test_the_4_5_6_and_8_bit_types_read_their_quads_in_place():
    assert set(BLOCK_QUAD_TYPES) == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


# where the K-quants' block_quads fold their scales in (BlockPieces.accumulate_block_quads): which packed array holds
# the scale of each quad group (Q4_K's and Q5_K's one a 32-element sub-block, Q6_K's one a 16-element group)
FOLDED_SCALES = {"Q4_K": 1, "Q5_K": 2, "Q6_K": 2}


def _block_quads(pieces, w, x8, xs, i0, ntok, nb, groups):
    block_quads, qk = pieces.block_quads, pieces.block_size

    @njit
    def run(w, x8, xs):
        part = np.full((nb, ntok, groups, ROWS), 12345, np.int32)
        for b in range(nb):
            if ntok == 2:
                block_quads(w, 0, b, x8, xs, i0, 2, b * qk, part[b])
            else:
                block_quads(w, 0, b, x8, xs, i0, 1, b * qk, part[b])
        return part
    return run(w, x8, xs)


@pytest.mark.parametrize("ntok", [1, 2])
@pytest.mark.parametrize("w_type", BLOCK_QUAD_TYPES)
def test_block_quads_are_the_group_sums_of_the_decoded_block(w_type, ntok):
    """block_quads (the sums straight from the packed words) against the decoded values times the
    activations in int64, per the groups the quads sum on this target; the extremes of the activations
    against a row of the largest stored values."""
    traits = type_traits(w_type)
    pieces = qmm.cpu_pieces(traits)
    if not quads_are_exact(pieces.quad_bias):
        pytest.skip(f"{w_type}'s quads (bias {pieces.quad_bias}) are exact only where they add in int32 (VNNI); "
                    "this CPU's products take its int16 path")
    qk, nb = traits.block_size, 2
    k = nb * qk
    wf = np.random.default_rng(5).standard_normal((ROWS, k)).astype(np.float32)
    wf[0] = np.where(np.arange(k) % 2, 1.0, -1.0) * np.linspace(0.5, 1.0, k)
    w = pieces.pack(ggflow.quantize(wf, w_type), ROWS, k)
    wd, _ = _decoded(pieces, w, nb)
    qgroups = tmpl.quad_plan(pieces, quads_add_in_int32())[0]
    gsize = qk // qgroups
    rng = np.random.default_rng(6 + ntok)
    x8 = rng.integers(-128, 128, (4, k)).astype(np.int8)
    i0 = 1
    x8[i0, ::3] = -128
    x8[i0 + ntok - 1, 1::5] = 127
    xs = x8.astype(np.int64).reshape(4, -1, gsize).sum(axis=2).astype(np.int32)
    part = _block_quads(pieces, w, x8, xs, i0, ntok, nb, qgroups)
    folds = tmpl.block_quads_accumulate(pieces, quads_add_in_int32()) is pieces.accumulate_block_quads
    for b in range(nb):
        for u in range(ntok):
            prod = wd[b].astype(np.int64) * x8[i0 + u, b * qk:(b + 1) * qk].astype(np.int64)[:, None]
            want = prod.reshape(qgroups, gsize, ROWS).sum(axis=1)
            if folds:    # each even group's slot holds it and the next one times their scales
                sc = w[FOLDED_SCALES[w_type]][0, b].astype(np.int64)
                want[0::2] = sc[0::2] * want[0::2] + sc[1::2] * want[1::2]
            np.testing.assert_array_equal(part[b, u], want, err_msg=f"block {b}, token {u}")


@njit(cache=True)
def _nibbles(words, highs, x8, part, xs, hs_lo, hs_hi):
    word_quad_sums(words, highs, (0, 1, 2, 3, 1, hs_lo, hs_hi), x8, 0, 1, (8, 40, 0, 1, 2, 3), part, ROWS, 1,
                     xs, 16, 0)


def test_word_quad_sums_place_a_fifth_bit_and_take_the_bias_out():
    """One high bit from highs (hbits=1, the Q5 layout a type may bring), at run-time shifts, bias 16."""
    rng = np.random.default_rng(11)
    words = rng.integers(-2 ** 31, 2 ** 31, (1, 2, 6, ROWS), dtype=np.int64).astype(np.int32)
    highs = rng.integers(-2 ** 31, 2 ** 31, (1, 2, 6, ROWS), dtype=np.int64).astype(np.int32)
    x8 = rng.integers(-128, 128, (1, 64)).astype(np.int8)
    xs = np.arange(8, dtype=np.int32)[None, :] * 37 - 100
    part = np.zeros((1, 2, ROWS), np.int32)
    _nibbles(words, highs, x8, part, xs, 3, 6)
    wb = words[0, 1, 2:5].view(np.uint8).reshape(3, ROWS, 4).astype(np.int64)     # [j, row, byte]
    hb = highs[0, 1, 1:4].view(np.uint8).reshape(3, ROWS, 4).astype(np.int64)
    for half, (o, shift, xg) in enumerate(((8, 3, 2), (40, 6, 3))):
        vals = ((wb >> (4 * half)) & 15) | (((hb >> shift) & 1) << 4)               # 0..31
        xq = x8[0, o:o + 12].astype(np.int64).reshape(3, 1, 4)
        want = (vals * xq).sum(axis=(0, 2)) - 16 * xs[0, xg]
        np.testing.assert_array_equal(part[0, half], want)


def test_block_quads_need_decode_quads():
    pieces = qmm.cpu_pieces(type_traits("Q4_0"))
    with pytest.raises(ValueError, match="block_quads needs decode_quads"):
        BlockPieces(32, 2, pieces.pack, pieces.block_sums, pieces.decode, pieces.accumulate,
                    block_quads=pieces.block_quads)
