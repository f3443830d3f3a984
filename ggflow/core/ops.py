"""Graph-building functions: each returns a new Tensor describing an op on its inputs. Nothing runs.

Semantics follow ggml (ggml.h). Shapes are ggml's ``ne`` (innermost first). Each builder checks its
inputs and raises ``ShapeError`` naming the op and the shapes when they don't fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Sequence

from ggflow.core.tensor import MAX_DIMS, Tensor, TensorFlag
from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import PluginError, ShapeError, UnknownNameError
from ggflow.plugins.removed import removed_names

# RoPE modes, as ggml numbers them.
ROPE_NORMAL = 0   # rotate adjacent pairs (x[2i], x[2i+1]): llama as GGUF stores its Q/K
ROPE_NEOX = 2     # rotate halves (x[i], x[i + n_dims/2]): qwen2, gpt-neox

class Op(StrEnum):
    """The op names a graph node carries (``Tensor.op``): what backends dispatch on.

    A StrEnum, so a name compares equal to its string (``Op.ADD == "add"``) and a plugin's own op
    can be any other string. ``transpose`` is a ``PERMUTE``.
    """

    NONE = "none"   # a leaf: a weight, a graph input, the KV cache
    GET_ROWS = "get_rows"
    MUL_MAT = "mul_mat"
    ADD = "add"
    MUL = "mul"
    SCALE = "scale"
    RMS_NORM = "rms_norm"
    NORM = "norm"
    ROPE = "rope"
    SOFT_MAX = "soft_max"
    SILU = "silu"
    GELU = "gelu"
    TANH = "tanh"
    VIEW = "view"
    RESHAPE = "reshape"
    PERMUTE = "permute"
    CONT = "cont"
    CPY = "cpy"
    SET_ROWS = "set_rows"
    MUL_MAT_ID = "mul_mat_id"   # mixture of experts: each token's rows times its chosen experts' matrices
    ARGSORT = "argsort"
    SIGMOID = "sigmoid"
    SUM_ROWS = "sum_rows"
    DIV = "div"
    CLAMP = "clamp"
    CONCAT = "concat"
    ADD_ID = "add_id"               # a + the rows of b the ids choose (the chosen experts' biases)
    SOFT_MAX_SINKS = "soft_max_sinks"   # soft_max with one extra logit per head in each row's sum (gpt-oss)

    def __repr__(self) -> str:  # messages quote a node's op as the string it equals
        return repr(self.value)


# Views compute nothing: their memory is their source's, so a backend has nothing to run for them.
PURE_VIEWS: frozenset[Op] = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE})

# Views that write: the result is the destination's memory (src[0] for set_rows, src[1] for cpy), so
# the backend that holds the destination must run them.
IN_PLACE: frozenset[Op] = frozenset({Op.SET_ROWS, Op.CPY})


@dataclass(frozen=True)
class PluginOp:
    """An op an architecture adds to the op set: how to shape its result, and what it computes.

    shape(src, params) -> (type name, ne) of the result; it raises ShapeError for sources that don't fit.
    reference(arrays, params) -> the result as float32 values shaped ne[::-1]: arrays are the sources as
    numpy arrays in numpy order (ne reversed, 4 axes), float32 for every float or quantized source and as
    stored for integer ones. numpy or numba: the CPU backend runs it for any node of this op it has no
    kernel for, so the op works everywhere at once; a backend gets fast at it by handling ``name`` in its
    ``supports_op`` and compile (nodes of the op carry ``Tensor.op == name``).
    """
    name: str
    shape: Callable[[Sequence[Tensor], tuple[Any, ...]], tuple[str, Sequence[int]]]
    reference: Callable[[list[Any], tuple[Any, ...]], Any]


_plugin_ops: dict[str, PluginOp] = {}


def register_op(name: str, shape: Callable, reference: Callable) -> PluginOp:
    """Add an op to the op set (an architecture calls this from its register_architectures hook).

    Registering the same functions again is a no-op; another op under a taken name is a PluginError."""
    if any(name == op for op in Op):
        raise PluginError(f"op {name!r} is a built-in op; a plugin op needs a name of its own")
    spec = PluginOp(name, shape, reference)
    known = _plugin_ops.get(name)
    if known is not None and known != spec:
        raise PluginError(f"op {name!r} is already registered (reference {known.reference!r})")
    _plugin_ops[name] = spec
    return spec


def plugin_op(name: str) -> PluginOp | None:
    """The registered plugin op of that name, or None (a built-in op, or nothing)."""
    return _plugin_ops.get(name)


def custom(name: str, *src: Tensor, params: Sequence[Any] = ()) -> Tensor:
    """A node of a registered plugin op over src, with op_params params."""
    spec = _plugin_ops.get(name)
    if spec is None:
        raise UnknownNameError("plugin op (ggflow.core.ops.register_op)", name, list(_plugin_ops))
    type_name, ne = spec.shape(src, tuple(params))
    return _op(type_name, ne, name, src, tuple(params))  # type: ignore[arg-type]


def _shape(t: Tensor) -> str:
    return f"{t.name or t.op}{list(t.ne[: t.n_dims])}"


def _fail(op: Op, msg: str, *tensors: Tensor) -> ShapeError:
    return ShapeError(f"{op}: {msg} ({', '.join(_shape(t) for t in tensors)})")


def new_tensor(type: "TypeTraits | str", ne: Sequence[int], name: str = "", flags: int = 0) -> Tensor:
    """A leaf: a weight, the KV cache, or (with TensorFlag.INPUT) a graph input."""
    return Tensor(type, ne, name=name, flags=flags)


def new_input(type: "TypeTraits | str", ne: Sequence[int], name: str) -> Tensor:
    return Tensor(type, ne, name=name, flags=TensorFlag.INPUT)


def _op(type: "TypeTraits | str", ne: Sequence[int], op: Op, src: Sequence[Tensor], params=(),
        name: str = "") -> Tensor:
    return Tensor(type, ne, op=op, op_params=params, src=src, name=name)


def _can_repeat(b: Tensor, a: Tensor) -> bool:
    """ggml's rule for broadcasting b over a: each dim of a is a whole multiple of b's."""
    return all(an == bn or (bn > 0 and an % bn == 0) for an, bn in zip(a.ne, b.ne))


# -- arithmetic ----------------------------------------------------------------------------------
def add(a: Tensor, b: Tensor) -> Tensor:
    if not _can_repeat(b, a):
        raise _fail(Op.ADD, "b must repeat evenly over a", a, b)
    return _op(a.type, a.ne, Op.ADD, (a, b))


def mul(a: Tensor, b: Tensor) -> Tensor:
    if not _can_repeat(b, a):
        raise _fail(Op.MUL, "b must repeat evenly over a", a, b)
    return _op(a.type, a.ne, Op.MUL, (a, b))


def div(a: Tensor, b: Tensor) -> Tensor:
    """a / b, b repeated over a as in add."""
    if not _can_repeat(b, a):
        raise _fail(Op.DIV, "b must repeat evenly over a", a, b)
    return _op(a.type, a.ne, Op.DIV, (a, b))


def scale(a: Tensor, s: float, bias: float = 0.0) -> Tensor:
    """a * s + bias."""
    return _op(a.type, a.ne, Op.SCALE, (a,), (float(s), float(bias)))


def silu(a: Tensor) -> Tensor:
    return _op(a.type, a.ne, Op.SILU, (a,))


def gelu(a: Tensor) -> Tensor:
    """GELU with the tanh approximation, as ggml_gelu computes it."""
    return _op(a.type, a.ne, Op.GELU, (a,))


def tanh(a: Tensor) -> Tensor:
    return _op(a.type, a.ne, Op.TANH, (a,))


def sigmoid(a: Tensor) -> Tensor:
    """1 / (1 + exp(-x)): a sigmoid-gated router's probabilities."""
    return _op(a.type, a.ne, Op.SIGMOID, (a,))


def clamp(a: Tensor, min: float, max: float) -> Tensor:
    """Each element limited to [min, max] (either may be +-inf)."""
    return _op(a.type, a.ne, Op.CLAMP, (a,), (float(min), float(max)))


def sum_rows(a: Tensor) -> Tensor:
    """The sum of each row: [ne0, ne1, ne2, ne3] -> [1, ne1, ne2, ne3]."""
    return _op(a.type, (1, a.ne[1], a.ne[2], a.ne[3]), Op.SUM_ROWS, (a,))


def concat(a: Tensor, b: Tensor, dim: int) -> Tensor:
    """a and b joined along dim (0..3); every other dim must agree (ggml_concat)."""
    if not 0 <= dim < MAX_DIMS or any(a.ne[d] != b.ne[d] for d in range(MAX_DIMS) if d != dim):
        raise _fail(Op.CONCAT, f"shapes must agree except along dim {dim}", a, b)
    if a.type.name != b.type.name or a.type.is_quantized:
        raise _fail(Op.CONCAT, f"a and b must share one float type, not {a.type.name} and {b.type.name}", a, b)
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return _op(a.type, ne, Op.CONCAT, (a, b), (int(dim),))


# -- ordering ------------------------------------------------------------------------------------
SORT_ASC, SORT_DESC = 0, 1   # ggml_sort_order


def argsort(a: Tensor, order: int = SORT_ASC) -> Tensor:
    """I32 indices that sort each row of a (F32) ascending or descending; ties keep index order."""
    if a.type.name != "F32":
        raise _fail(Op.ARGSORT, f"a must be F32, not {a.type.name}", a)
    if order not in (SORT_ASC, SORT_DESC):
        raise _fail(Op.ARGSORT, f"order {order} is neither SORT_ASC nor SORT_DESC", a)
    return _op("I32", a.ne, Op.ARGSORT, (a,), (int(order),))


def argsort_top_k(a: Tensor, k: int) -> Tensor:
    """The indices of each row's k largest values, largest first: [k, ne1, ne2, ne3] I32, a view of a
    descending argsort (ggml_argsort_top_k)."""
    if not 0 < k <= a.ne[0]:
        raise _fail(Op.ARGSORT, f"k={k} must be in 1..{a.ne[0]} (the row length)", a)
    order = argsort(a, SORT_DESC)
    return view(order, (k, a.ne[1], a.ne[2], a.ne[3]), order.nb)


# -- normalization -------------------------------------------------------------------------------
def rms_norm(a: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over each row (ne[0])."""
    return _op(a.type, a.ne, Op.RMS_NORM, (a,), (float(eps),))


def norm(a: Tensor, eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over each row: LayerNorm without its affine part."""
    return _op(a.type, a.ne, Op.NORM, (a,), (float(eps),))


def soft_max(a: Tensor, mask: Tensor | None = None, scale: float = 1.0) -> Tensor:
    """softmax(a * scale + mask) over each row. mask: [ne0, >= ne1] broadcast over dims 2 and 3."""
    if mask is not None:
        if mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1] or not (
                a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0):
            raise _fail(Op.SOFT_MAX, "mask must be [ne0, >= ne1] and broadcast over dims 2, 3", a, mask)
        if mask.type.name not in ("F32", "F16"):
            raise _fail(Op.SOFT_MAX, f"mask must be F32 or F16, not {mask.type.name}", mask)
    return _op("F32", a.ne, Op.SOFT_MAX, (a,) if mask is None else (a, mask), (float(scale),))


def soft_max_sinks(a: Tensor, mask: Tensor | None, scale: float, sinks: Tensor) -> Tensor:
    """soft_max(a * scale + mask) where each row's normalisation also counts exp(sinks[head]) (an attention
    sink: a logit of no value that takes a share of the weight), head = dim 2 of a (ggml_soft_max_ext with
    ggml_soft_max_add_sinks, as one node: a backend that runs soft_max need not know about sinks)."""
    if sinks.type.name != "F32" or sinks.nelements != a.ne[2]:
        raise _fail(Op.SOFT_MAX_SINKS, f"sinks must be F32 with one value per head ({a.ne[2]})", a, sinks)
    plain = soft_max(a, mask, scale)        # the checks of soft_max
    return _op("F32", a.ne, Op.SOFT_MAX_SINKS, (*plain.src, sinks), plain.op_params)


def add_id(a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_add_id: a [ne0, n_used, n_tokens] + b[:, ids[e, t]] for b [ne0, n_expert], ids I32 [n_used,
    n_tokens]: each chosen expert's bias added to its output."""
    if ids.type.name != "I32" or ids.ne[:2] != a.ne[1:3] or b.ne[0] != a.ne[0] or b.ne[2] != 1:
        raise _fail(Op.ADD_ID, "a [n, n_used, n_tokens], b [n, n_expert], ids [n_used, n_tokens] I32", a, b, ids)
    return _op("F32", a.ne, Op.ADD_ID, (a, b, ids))


# -- matrix multiplication and lookup ------------------------------------------------------------
def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: a [k, m, A2, A3] x b [k, n, B2, B3] -> F32 [m, n, B2, B3].

    out[.., j, i] = dot(a row i, b row j); a's dims 2 and 3 broadcast over b's (GQA: several query
    heads share one K/V head).
    """
    if a.ne[0] != b.ne[0] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise _fail(Op.MUL_MAT, "a and b need the same row length and a's dims 2, 3 must divide b's", a, b)
    if b.type.is_quantized:
        raise _fail(Op.MUL_MAT, f"b must be a float type, not {b.type.name}", b)
    return _op("F32", (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), Op.MUL_MAT, (a, b))


def mul_mat_id(as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_mul_mat_id: each token's rows times the matrices of the experts it chose.

    as_ [k, m, n_expert] (one matrix per expert), b [k, n_b, n_tokens] with n_b 1 or dividing n_used,
    ids I32 [n_used, n_tokens] -> F32 [m, n_used, n_tokens]:
    out[:, e, t] = as_[:, :, ids[e, t]] @ b[:, e % n_b, t].
    """
    if ids.type.name != "I32" or ids.ne[2] != 1 or ids.ne[3] != 1:
        raise _fail(Op.MUL_MAT_ID, f"ids must be 2-D I32, not {ids.type.name}", ids)
    if as_.ne[3] != 1 or b.ne[3] != 1 or as_.ne[0] != b.ne[0]:
        raise _fail(Op.MUL_MAT_ID, "as [k, m, n_expert] and b [k, n, n_tokens] need one row length k", as_, b)
    if ids.ne[1] != b.ne[2] or ids.ne[0] % b.ne[1]:
        raise _fail(Op.MUL_MAT_ID, "ids [n_used, n_tokens] must match b [k, n_used or a divisor, n_tokens]",
                    b, ids)
    if b.type.is_quantized:
        raise _fail(Op.MUL_MAT_ID, f"b must be a float type, not {b.type.name}", b)
    return _op("F32", (as_.ne[1], ids.ne[0], b.ne[2], 1), Op.MUL_MAT_ID, (as_, b, ids))


def get_rows(a: Tensor, rows: Tensor) -> Tensor:
    """Gather rows of a (any type, e.g. a quantized embedding) by I32 ids: -> F32 [ne0, n, ...]."""
    if rows.type.name != "I32":
        raise _fail(Op.GET_ROWS, f"row ids must be I32, not {rows.type.name}", rows)
    if rows.ne[1] != a.ne[2] or rows.ne[2] != a.ne[3] or rows.ne[3] != 1:  # as ggml_get_rows
        raise _fail(Op.GET_ROWS, "ids [n, B] must match a [ne0, rows, B]", a, rows)
    return _op("F32", (a.ne[0], rows.ne[0], rows.ne[1], rows.ne[2]), Op.GET_ROWS, (a, rows))


def set_rows(dst: Tensor, src: Tensor, rows: Tensor) -> Tensor:
    """Write src's rows into dst at the I32 row ids, converting to dst's type (KV-cache writes).

    Returns a view of dst: expand it into the graph so the write happens before dst is read.
    """
    if rows.type.name not in ("I32",):
        raise _fail(Op.SET_ROWS, f"row ids must be I32, not {rows.type.name}", rows)
    if src.ne[0] != dst.ne[0] or rows.ne[0] != src.ne[1] or src.ne[2] != 1 or src.ne[3] != 1:
        raise _fail(Op.SET_ROWS, "src [ne0, n] must match dst [ne0, rows] and ids [n]", dst, src, rows)
    if src.type.is_quantized:
        raise _fail(Op.SET_ROWS, f"src must be a float type, not {src.type.name}", src)
    return Tensor(dst.type, dst.ne, dst.nb, op=Op.SET_ROWS, src=(dst, src, rows), view_src=dst)


def cpy(a: Tensor, b: Tensor) -> Tensor:
    """Copy a into b's memory, converting the type. Returns a view of b."""
    if a.nelements != b.nelements:
        raise _fail(Op.CPY, "a and b must have the same number of elements", a, b)
    return Tensor(b.type, b.ne, b.nb, op=Op.CPY, src=(a, b), view_src=b)


def cont(a: Tensor) -> Tensor:
    """A contiguous copy of a (after permute/transpose)."""
    return _op(a.type, a.ne, Op.CONT, (a,))


# -- RoPE ----------------------------------------------------------------------------------------
def rope(a: Tensor, positions: Tensor, n_dims: int, mode: int = ROPE_NORMAL, *, freq_base: float = 10000.0,
         freq_scale: float = 1.0, n_ctx_orig: int = 0, ext_factor: float = 0.0, attn_factor: float = 1.0,
         beta_fast: float = 32.0, beta_slow: float = 1.0, freq_factors: Tensor | None = None) -> Tensor:
    """Rotary position embedding of a [head_dim, n_head, n_tokens] by I32 positions [n_tokens].

    The first n_dims of each head rotate; YaRN parameters follow ggml_rope_ext. freq_factors (llama 3
    rope scaling) divide each pair's angle.
    """
    if positions.type.name != "I32" or positions.ne[0] != a.ne[2]:
        raise _fail(Op.ROPE, "positions must be I32 [n_tokens] with n_tokens = a.ne[2]", a, positions)
    if n_dims > a.ne[0] or n_dims % 2:
        raise _fail(Op.ROPE, f"n_dims={n_dims} must be even and <= head size", a)
    if mode not in (ROPE_NORMAL, ROPE_NEOX):
        raise _fail(Op.ROPE, f"mode {mode} is not supported (normal={ROPE_NORMAL}, neox={ROPE_NEOX})", a)
    src = (a, positions) if freq_factors is None else (a, positions, freq_factors)
    if freq_factors is not None and freq_factors.ne[0] < n_dims // 2:
        raise _fail(Op.ROPE, "freq_factors needs n_dims/2 entries", freq_factors)
    params = (int(n_dims), int(mode), int(n_ctx_orig), float(freq_base), float(freq_scale),
              float(ext_factor), float(attn_factor), float(beta_fast), float(beta_slow))
    return _op(a.type, a.ne, Op.ROPE, src, params)


# -- views ---------------------------------------------------------------------------------------
def view(a: Tensor, ne: Sequence[int], nb: Sequence[int] | None = None, offset: int = 0) -> Tensor:
    """A view of a's memory with shape ne, byte strides nb (default: contiguous) at a byte offset."""
    t = Tensor(a.type, ne, nb, op=Op.VIEW, src=(a,), view_src=a, view_offs=offset)
    if offset < 0 or offset + t.nbytes > a.nbytes:
        raise _fail(Op.VIEW, f"offset {offset} + {t.nbytes} bytes exceeds the source's {a.nbytes}", a)
    return t


def reshape(a: Tensor, *ne: int) -> Tensor:
    if not a.is_contiguous():
        raise _fail(Op.RESHAPE, "needs a contiguous tensor (use cont first)", a)
    t = Tensor(a.type, ne, op=Op.RESHAPE, src=(a,), view_src=a)
    if t.nelements != a.nelements:
        raise _fail(Op.RESHAPE, f"cannot reshape to {list(ne)}", a)
    return t


def permute(a: Tensor, ax0: int, ax1: int, ax2: int, ax3: int) -> Tensor:
    """ggml_permute: source axis i moves to position ax_i."""
    axes = (ax0, ax1, ax2, ax3)
    if sorted(axes) != list(range(MAX_DIMS)):
        raise _fail(Op.PERMUTE, f"axes {axes} must be a permutation of 0..3", a)
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    return Tensor(a.type, ne, nb, op=Op.PERMUTE, src=(a,), view_src=a, op_params=axes)


def transpose(a: Tensor) -> Tensor:
    return permute(a, 1, 0, 2, 3)


__getattr__ = removed_names(__name__)   # a removed name says what replaced it
