"""Matrix multiplication of GGUF weights (every quant type the CPU backend runs) with f32 activations.

    pw = pack_weight(w, "Q4_K")          # once per weight, at load
    mul_mat(pw, x, out)                  # out[i, r] = dot(W[r], x[i]); x (n, k) f32, out (n, rows) f32

Every quantized type runs in one skeleton (``qmm.template``) specialised by the type's pieces
(``cpu_pieces.BlockPieces``): the built-in ones in ``qmm.legacy`` / ``qmm.kquants``, a plugin type's
in its TypeTraits (``kernels={"cpu": BlockPieces(...)}``). A quantized type with no pieces is converted
once, when packed, with its own to_float, to a float type (F16, 2 bytes per weight, or F32 when that is
its vec_dot_type) and runs that type's kernel.

Numerics follow ggml: activations are quantized to the weight type's vec_dot_type (Q8_0 for
Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K types) with ggml's reference quantizers, the block
dot products are exact integers, and the scales are applied and accumulated in f32. F16 and BF16
weights take activations rounded to F16 / BF16; F32 weights take them as they are.

Quantized weights are repacked once into a row-tiled layout (see ``qmm.layout``), in runs of whole tiles
of about ``PACK_CHUNK_BYTES`` of GGUF data: a copy the size of the GGUF data for the 32-element types (f16
scales kept as f16), +0% to +3% for the K types (6-bit scales unpacked to bytes, f16 super-block scales kept
as f16 but Q6_K's, f32 there, +1%; Q3_K +33%, its quants widened to nibbles); the mmap'd bytes are not kept
(the backend gives a run's pages back as soon as it is packed: ``pack_weight``'s ``packed_rows``).
F32/F16/BF16 weights are used in place (a reference to ``w``, no copy). docs/performance.md has the
per-type figures and speeds.

n == 1 (decode) and small n take the matvec path (one decode-and-multiply pass per token); larger n
a batched one, which decodes each block of a row tile once and reuses it for all tokens: byte dot
products where the type has ``decode_quads``, int16 pairs into int32 lanes from
``qmm.template.PAIRS_MIN_TOKENS`` tokens on AVX-512, else int16 sums (``qmm.template.batch_path``
decides, ``PackedWeight.kernel`` asks it).
Threads: numba's prange over row tiles, as many as ``numba.set_num_threads`` allows; products below
``PARALLEL_MIN_MACS``, and every product on one thread, run on the calling thread; ``bind_mul_mat``'s
bigger ones run parallel or serial, whichever is faster now (``thread_choice``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Hashable, Sequence

import numba
import numpy as np
from numba import typeof

from ggflow.backends_builtin.cpu.products.qmm import act
from ggflow.backends_builtin.cpu.products.qmm import floats as flt
from ggflow.backends_builtin.cpu.products.qmm import groups
from ggflow.backends_builtin.cpu.products.qmm import kquants as kq
from ggflow.backends_builtin.cpu.products.qmm import legacy as leg
from ggflow.backends_builtin.cpu.products.qmm import mxfp4 as mx
from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
from ggflow.backends_builtin.cpu import entry_points, thread_choice
from ggflow.backends_builtin.cpu.products.qmm.layout import TILE
from ggflow.plugins.cpu_pieces import BlockPieces
from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import BackendError, ShapeError, UnknownNameError

# Below this many multiply-adds (n * rows * k) a product runs on the calling thread; above, parallel or
# serial, whichever its size's recent calls found faster (thread_choice). Starting a parallel region
# costs 10-20 us on an idle machine with passive threads, 150-300 us on a VM whose sleeping vCPU must be
# woken, a scheduler slice (ms) on a busy one. SmolLM2's decode products from 576 x 576 (35-95 us on one
# core) pay with spinning threads (GOMP_SPINCOUNT; docs/performance.md, "Threads"); its 192 x 576 ones
# (15 us) never do.
PARALLEL_MIN_MACS = 1 << 17

# GGUF bytes packed per pack() call (whole tiles, at least one): pack's temporaries (a contiguous copy of the
# run, the tiling's transpose) and the run's file pages, until the caller gives them back (packed_rows), are
# the peak's excess over the packed copy: ~6 MiB with 2 MiB runs, against 3x an 11 MiB weight packed whole
PACK_CHUNK_BYTES = 2 << 20
MAX_GROUP_WEIGHTS = groups.MAX_WEIGHTS   # bind_mul_mats' most weights in one call
ACTIVATION_TYPES = ("Q8_0", "Q8_1", "Q8_K")   # the vec_dot_types quantize_activations makes
_BUILTIN_PIECES: dict[str, BlockPieces] = {**leg.PIECES, **kq.PIECES, **mx.PIECES}

# element dtype, bytes per element, activation rounding
_FLOAT = {
    "F32": (np.float32, 4, None),
    "F16": (np.uint16, 2, flt.round_to_f16),
    "BF16": (np.uint16, 2, flt.round_to_bf16),
}

SUPPORTED_TYPES: frozenset[str] = frozenset(_BUILTIN_PIECES) | frozenset(_FLOAT)   # the built-in kernels

Kernel = Callable[..., None]


@dataclass(frozen=True)
class _QuantType:
    """A quantized type as the skeleton runs it: its pieces, activation type and literal kind."""
    traits: TypeTraits
    pieces: BlockPieces
    kind: str


class _Drivers:
    """A type's kernels for one argument layout, each compiled (or loaded from numba's cache) on first
    use: parallel or serial, and for quantized types the path ("tile", "pairs", "quads": tmpl.batch_path);
    for groups of weights of the type (``bind_mul_mats``), qmm.groups' kernels."""
    __slots__ = ("_compile", "_compile_group", "_kernels")

    def __init__(self, compile: Callable[[bool, str], Kernel],
                 compile_group: Callable[[bool, str], Kernel] | None = None):
        self._compile = compile
        self._compile_group = compile_group
        self._kernels: dict[tuple, Kernel] = {}

    def get(self, parallel: bool, path: str = "tile") -> Kernel:
        kernel = self._kernels.get((parallel, path))
        if kernel is None:
            kernel = self._kernels[parallel, path] = self._compile(parallel, path)
        return kernel

    def group(self, parallel: bool, path: str) -> Kernel:
        kernel = self._kernels.get((parallel, path, "group"))
        if kernel is None:
            kernel = self._kernels[parallel, path, "group"] = self._compile_group(parallel, path)
        return kernel


_QUANT_TYPES: dict[str, _QuantType] = {}
_DRIVERS: dict[tuple, _Drivers] = {}   # (kind, argument types) -> its drivers


def cpu_pieces(traits: TypeTraits) -> BlockPieces | None:
    """The CPU matmul pieces of a type: built in, or from its TypeTraits.kernels["cpu"]; None if it has none."""
    pieces = _BUILTIN_PIECES.get(traits.name) or traits.kernels.get("cpu")
    if pieces is not None and not isinstance(pieces, BlockPieces):
        raise BackendError(f"{traits.name}: TypeTraits.kernels['cpu'] must be a "
                           f"ggflow.plugins.cpu_pieces.BlockPieces, got {type(pieces).__name__}")
    return pieces


def _quant_type(traits: TypeTraits) -> _QuantType | None:
    qt = _QUANT_TYPES.get(traits.name)
    if qt is not None and qt.traits is traits:
        return qt
    pieces = cpu_pieces(traits)
    if pieces is None:
        return None
    if pieces.block_size != traits.block_size:
        raise BackendError(f"{traits.name}: its CPU pieces step over blocks of {pieces.block_size} elements "
                           f"but the type's blocks hold {traits.block_size}")
    if traits.vec_dot_type not in ACTIVATION_TYPES:
        raise BackendError(f"{traits.name}: vec_dot_type {traits.vec_dot_type!r} has no CPU activation "
                           f"quantizer; the matmul skeleton takes {', '.join(ACTIVATION_TYPES)}")
    qt = _QUANT_TYPES[traits.name] = _QuantType(traits, pieces, tmpl.register_pieces(traits.name, pieces))
    return qt


def has_kernel(w_type: str) -> bool:
    """Whether pack_weight takes this type: a float type, or a registered quantized type that either
    brings CPU pieces or can be decoded (to_float) and so converted once to a float type."""
    if str(w_type).upper() in SUPPORTED_TYPES:
        return True
    try:
        traits = type_traits(w_type)
    except UnknownNameError:
        return False
    return traits.is_quantized and (cpu_pieces(traits) is not None or traits.to_float is not None)


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A weight ready for ``mul_mat``: its type, logical shape, the arrays the kernels read, the kernels.

    ``kernel_type`` is the type the kernels run: ``w_type`` itself, or the float type a quantized type
    with no CPU pieces was converted to once, when packed."""
    w_type: str
    rows: int
    k: int
    arrays: tuple
    kernel_type: str
    kind: str                            # the literal the compiled kernels are specialised on
    vec_dot_type: str | None             # activations' quantized type; None: floats (rounding below)
    rounding: Callable | None
    drivers: _Drivers

    @property
    def parallel(self) -> Kernel:
        return self.drivers.get(True)

    @property
    def serial(self) -> Kernel:
        return self.drivers.get(False)

    def kernel(self, parallel: bool, n_tokens: int) -> Kernel:
        """The kernel for a product of n_tokens rows (the same results whichever runs): quantized batches
        take the quads kernel from the type's quads_from where it has decode_quads, else the pairs kernel
        from PAIRS_MIN_TOKENS where the CPU has AVX-512 (int16 pairs into int32 lanes), else the tile one."""
        if self.vec_dot_type is None:
            return self.drivers.get(parallel)
        return self.drivers.get(parallel, tmpl.batch_path(self.kind, n_tokens))

    @property
    def nbytes(self) -> int:
        """Memory the packed arrays hold (for F32/F16/BF16: the caller's array, not a copy)."""
        return sum(a.nbytes for a in self.arrays)


def pack_weight(w: np.ndarray, w_type: str,
                packed_rows: Callable[[int, int], object] | None = None) -> PackedWeight:
    """Prepare a 2-D GGUF weight (rows = ggml ne1, k = ne0) for ``mul_mat``.

    ``w`` is (rows, row_bytes) uint8 as stored in the file; F32/F16/BF16 may also come as their
    (rows, k) float32 / float16 / uint16 array. ``packed_rows(r0, r1)`` is called as each run of rows
    [r0, r1) has been copied into the packed arrays, whose kernels never read ``w`` again: the caller may
    give those rows' memory back then (a memory map's pages) rather than hold the whole weight twice.
    It is not called where nothing was copied: types used in place (F32/F16/BF16), a pack returning views of w.
    """
    w_type = str(w_type).upper()
    w = np.asarray(w)
    if w.ndim != 2:
        raise ShapeError(f"pack_weight wants a 2-D weight (rows, row bytes), got shape {w.shape}")
    if w_type in _FLOAT:
        return _pack_float(w, w_type)
    traits = _known_quant_type(w_type)
    if w.dtype != np.uint8:
        raise ShapeError(f"{w_type} weight must be the raw uint8 block bytes, got dtype {w.dtype}")
    rows, row_bytes = w.shape
    if row_bytes % traits.type_size:
        raise ShapeError(f"{w_type} rows of {row_bytes} bytes are not a whole number of "
                         f"{traits.type_size}-byte blocks")
    k = row_bytes // traits.type_size * traits.block_size
    qt = _quant_type(traits)
    if qt is None:
        return _pack_converted(w, traits, rows, k)
    arrays = _pack_in_chunks(qt.pieces.pack, w, rows, k, packed_rows)
    return PackedWeight(w_type, rows, k, arrays, w_type, qt.kind, traits.vec_dot_type, None,
                        _quant_drivers(qt, arrays, k))


def pack_chunk_rows(row_bytes: int) -> int:
    """Rows per pack() call: whole tiles of about PACK_CHUNK_BYTES, at least one tile."""
    return max(1, PACK_CHUNK_BYTES // (TILE * max(row_bytes, 1))) * TILE


def _pack_in_chunks(pack: Callable, w: np.ndarray, rows: int, k: int,
                    packed_rows: Callable[[int, int], object] | None = None) -> tuple:
    """pack() over runs of whole tiles (pack_chunk_rows) into arrays allocated once: a weight's packed copy
    then never has pack's temporaries for more than a run beside it, nor, where the caller releases them as
    told (packed_rows), more than a run of its source. Tiles are independent, so runs of whole tiles pack to
    the same bytes as one call."""
    chunk = pack_chunk_rows(w.shape[1])
    n_tiles = -(-rows // TILE)
    arrays = None
    for r0 in range(0, rows, chunk):
        n = min(chunk, rows - r0)
        part = tuple(pack(np.ascontiguousarray(w[r0:r0 + n]), n, k))
        t0, t1 = r0 // TILE, r0 // TILE + -(-n // TILE)
        if any(a.shape[0] != t1 - t0 for a in part):
            raise BackendError(f"a pack function returned arrays of shapes {[a.shape for a in part]} for "
                               f"{n} rows: each must be (n_tiles={t1 - t0}, ..., TILE) (cpu_pieces)")
        if n == rows:
            arrays = part                                # one run: pack's own arrays are the whole
        else:
            if arrays is None:
                arrays = tuple(np.empty((n_tiles,) + a.shape[1:], a.dtype) for a in part)
            for whole, piece in zip(arrays, part):
                whole[t0:t1] = piece
        if packed_rows is not None and not any(np.may_share_memory(a, w) for a in arrays):
            packed_rows(r0, r0 + n)     # (a plugin's pack that returned views of w has copied nothing)
    return arrays


def _known_quant_type(w_type: str) -> TypeTraits:
    try:
        traits = type_traits(w_type)
    except UnknownNameError:
        traits = None
    if traits is None or not has_kernel(w_type):
        raise BackendError(f"no CPU matmul kernel for weight type {w_type!r}; kernels exist for "
                           f"{', '.join(sorted(SUPPORTED_TYPES))} and registered quantized types that can be "
                           f"decoded (dequantize to F32 for others)")
    return traits


def _quant_drivers(qt: _QuantType, arrays: tuple, k: int) -> _Drivers:
    w_type = typeof(arrays)
    drivers = _DRIVERS.get((qt.kind, w_type))
    if drivers is None:   # the types only: a driver must not keep the first weight it saw alive
        acts = quantize_activations(np.zeros((1, k), np.float32), qt.traits.vec_dot_type)
        arg_types = (w_type, *(typeof(a) for a in acts), typeof(np.zeros((1, 1), np.float32)))
        drivers = _DRIVERS[(qt.kind, w_type)] = _Drivers(
            lambda parallel, path: tmpl.entry_point(qt.kind, parallel, arg_types, path),
            lambda parallel, path: groups.entry_point(qt.kind, parallel, arg_types, path))
    return drivers


def _pack_float(w: np.ndarray, w_type: str, as_type: str | None = None) -> PackedWeight:
    dtype, size, rounding = _FLOAT[w_type]
    if w.dtype == np.uint8:
        if w.shape[1] % size:
            raise ShapeError(f"{w_type} rows of {w.shape[1]} bytes are not whole {size}-byte elements")
        w = np.ascontiguousarray(w).view(dtype)
    elif w_type == "F16" and w.dtype == np.float16:
        w = w.view(np.uint16)
    elif w.dtype != dtype:
        raise ShapeError(f"{w_type} weight must be uint8 bytes or a {np.dtype(dtype).name} array, got {w.dtype}")
    w = np.ascontiguousarray(w)   # a no-op for the mmap'd views the loader passes
    matrix = typeof(np.zeros((1, 1), np.float32))        # x and out: C-contiguous float32
    arg_types = (typeof(w), matrix, matrix)
    drivers = _DRIVERS.get((w_type, arg_types[0]))
    if drivers is None:   # the types only: a driver must not keep the first weight it saw alive
        drivers = _DRIVERS[(w_type, arg_types[0])] = _Drivers(
            lambda parallel, path: flt.entry_point(w_type, parallel, arg_types))
    return PackedWeight(as_type or w_type, w.shape[0], w.shape[1], (w,), w_type, w_type, None, rounding, drivers)


def _pack_converted(w: np.ndarray, traits: TypeTraits, rows: int, k: int) -> PackedWeight:
    """A quantized type with no CPU pieces: decoded once with its to_float and kept in a float type the
    kernels run, the GGUF bytes not kept. The float type is the type's vec_dot_type when that is one
    (F32: 4 bytes per weight, the dot as ggml computes it), else F16 (2 bytes per weight; activations
    then rounded to F16 rather than to the vec_dot_type: closer to exact than ggml's dot, not bit-equal)."""
    target = traits.vec_dot_type if traits.vec_dot_type in _FLOAT else "F16"
    encode = type_traits(target).from_float                # float types: blocks of one element
    dtype, size, _ = _FLOAT[target]
    converted = np.empty((rows, k), dtype)
    step = max(1, (1 << 22) // k)                          # rows per chunk: 16 MiB of float32 at a time
    for r0 in range(0, rows, step):                        # whole-array steps, bounded memory
        chunk = np.ascontiguousarray(w[r0:r0 + step]).reshape(-1, traits.type_size)
        values = traits.to_float(chunk).reshape(-1, 1)
        converted[r0:r0 + step] = encode(values).view(dtype).reshape(-1, k)
    return _pack_float(converted, target, as_type=traits.name)


def mul_mat(pw: PackedWeight, x: np.ndarray, out: np.ndarray) -> None:
    """out[i, r] = dot(W[r], x[i]) for x (n, k) float32; out (n, rows) float32 is written in place."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    _check_shapes(pw, x, out)
    if x.shape[0] == 0 or pw.rows == 0:
        return
    target = out if out.flags.c_contiguous else np.empty(out.shape, np.float32)
    kernel = pw.kernel(use_parallel(x.shape[0] * pw.rows * pw.k, numba.get_num_threads()), x.shape[0])
    if pw.vec_dot_type is None:
        kernel(pw.kind, pw.arrays[0], pw.rounding(x) if pw.rounding else x, target)
    else:
        kernel(pw.kind, pw.arrays, *quantize_activations(x, pw.vec_dot_type), target)
    if target is not out:
        out[...] = target


def bind_mul_mat(pw: PackedWeight, x: np.ndarray, out: np.ndarray, n_threads: int | None = None,
                 scratch: dict | None = None, x_source: Hashable | None = None) -> Callable[[], None]:
    """``mul_mat(pw, x, out)`` prepared once for arrays whose memory stays put (a compiled plan's views).

    The checks, the choice of kernel and the activation buffers are settled here, so a call is at most one
    quantization and one kernel: what mul_mat costs on top of them (~2 us) is paid per plan, not per
    step. n_threads: what the call runs on (None: numba's count now); one thread always runs serially.
    A product big enough for threads runs parallel or serial, whichever its size's recent calls found
    faster (thread_choice: a busy machine makes the parallel one the slower). scratch: a dict shared by
    calls that never run at the same time (one plan's), which then share one set of activation buffers
    per type and shape (a prompt's would otherwise hold n x k int16 per weight); None: buffers of its own.

    On the tile and quads paths a parallel call runs qmm.groups' driver as a group of one (``_bound_products``).

    x_source: what x is the memory of (the graph node), where it stays unchanged from its first product to
    its last, as a plan's node results do. Products bound in a plan's order with one x_source (a layer's
    q, k and v; gate and up) then quantize x once: the first bound always does, and a later one only if
    another x was quantized into the shared buffers in between (``_SharedActivations``).
    """
    _check_shapes(pw, x, out)
    if not (x.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous) or 0 in out.shape:
        return lambda: mul_mat(pw, x, out)
    threads = numba.get_num_threads() if n_threads is None else n_threads
    if pw.vec_dot_type is not None:
        return _bound_products([pw], x, [out], threads, scratch, x_source)
    parallel_ok = use_parallel(x.shape[0] * pw.rows * pw.k, threads)
    size_key = (pw.w_type, *x.shape, pw.rows, threads)
    # floats: the parallel driver is compiled on its first call, not here
    if pw.rounding is None:
        serial = partial(pw.serial, pw.kind, pw.arrays[0], x, out)
        parallel = lambda: pw.parallel(pw.kind, pw.arrays[0], x, out)                # noqa: E731
    else:
        serial = lambda: pw.serial(pw.kind, pw.arrays[0], pw.rounding(x), out)       # noqa: E731
        parallel = lambda: pw.parallel(pw.kind, pw.arrays[0], pw.rounding(x), out)   # noqa: E731
    return thread_choice.adaptive(size_key, parallel, serial) if parallel_ok else serial


def can_group(pws: Sequence[PackedWeight]) -> bool:
    """Whether ``bind_mul_mats`` takes these weights as one group: two or more of one quantized kind, packed
    into arrays of the same types (one compiled group kernel reads them all), at most MAX_GROUP_WEIGHTS."""
    first = pws[0]
    return (1 < len(pws) <= groups.MAX_WEIGHTS and first.vec_dot_type is not None
            and all(pw.kind == first.kind and pw.drivers is first.drivers and pw.k == first.k for pw in pws))


def bind_mul_mats(pws: Sequence[PackedWeight], x: np.ndarray, outs: Sequence[np.ndarray], n_threads: int | None = None,
                  scratch: dict | None = None, x_source: Hashable | None = None) -> Callable[[], None]:
    """The products ``mul_mat(pws[j], x, outs[j])`` prepared once as one call (``bind_mul_mat``'s terms): x
    quantized once, then one kernel over all the weights' row tiles, on one thread or in one parallel region
    (qmm.groups). The weights must pass ``can_group``. Outputs are those of separate products, bit for bit. A
    product size whose path has no group kernel (prompts on the pairs or AMX path), or arrays in another
    layout, runs the products one after another."""
    if not can_group(pws):
        raise ValueError("bind_mul_mats takes two or more weights of one quantized kind (can_group)")
    for pw, out in zip(pws, outs):
        _check_shapes(pw, x, out)
    contiguous = x.dtype == np.float32 and x.flags.c_contiguous and all(out.flags.c_contiguous for out in outs)
    if not contiguous or any(0 in out.shape for out in outs):
        calls = [bind_mul_mat(pw, x, out, n_threads, scratch, x_source) for pw, out in zip(pws, outs)]
        return partial(_run_all, calls)
    threads = numba.get_num_threads() if n_threads is None else n_threads
    return _bound_products(pws, x, outs, threads, scratch, x_source)


def _bound_products(pws: Sequence[PackedWeight], x: np.ndarray, outs: Sequence[np.ndarray], threads: int,
                    scratch: dict | None, x_source: Hashable | None) -> Callable[[], None]:
    """x quantized into the shared buffers (unless they hold it already), then its products by the weights pws
    (one kind) into outs: on the tile and quads paths one call for all of them (qmm.groups' drivers), else the
    template's drivers, one product after another. Each call parallel or serial, whichever is faster now
    (thread_choice), where it is large enough for threads; its parallel driver is compiled on first try.

    A single product on those paths runs the template's serial driver but the groups' parallel one, a group of
    one: a parallel driver holds ~2.3 MiB of code once loaded (a serial one ~0.5), so a plan with groups then
    loads one per type, and the padding a group of one passes (its weight and output three times: ~0.7 us to
    unbox) is paid only by products big enough for threads (tens of microseconds)."""
    first, n = pws[0], x.shape[0]
    shared = _activations(scratch, first.vec_dot_type, x)
    path = tmpl.batch_path(first.kind, n)
    if path in groups.GROUP_PATHS:
        group = groups.group_args(first.kind, [pw.arrays for pw in pws], shared.buffers, outs)
        serial = (partial(first.kernel(False, n), first.kind, first.arrays, *shared.buffers, outs[0]) if len(pws) == 1
                  else partial(first.drivers.group(False, path), *group))
        calls = [(pws, serial, partial(_call_driver, partial(first.drivers.group, path=path), group))]
    else:
        calls = []
        for pw, out in zip(pws, outs):
            args = (pw.kind, pw.arrays, *shared.buffers, out)
            calls.append(([pw], partial(pw.kernel(False, n), *args),
                          partial(_call_driver, partial(pw.kernel, n_tokens=n), args)))
    products = []
    for weights, serial, parallel in calls:
        rows = tuple(pw.rows for pw in weights)
        use_threads = use_parallel(n * sum(rows) * first.k, threads)
        products.append(thread_choice.adaptive((first.w_type, *x.shape, rows, threads), parallel, serial)
                        if use_threads else serial)
    return _after_quantizing(products[0] if len(products) == 1 else partial(_run_all, products),
                             first.vec_dot_type, x, shared, x_source)


def _call_driver(driver: Callable[..., Kernel], args: tuple) -> None:
    """The parallel driver, looked up (compiled or loaded) on its first call."""
    driver(parallel=True)(*args)


def _run_all(calls: Sequence[Callable[[], None]]) -> None:
    for call in calls:
        call()


def _activations(scratch: dict | None, vec_dot_type: str, x: np.ndarray) -> _SharedActivations:
    """The buffers x is quantized into: the plan's one set for this type and shape (scratch), else new ones."""
    key = ("activations", vec_dot_type, *x.shape)
    shared = scratch.get(key) if scratch is not None else None
    if shared is None:
        shared = _SharedActivations(quantize_activations(x, vec_dot_type))   # refilled at every call
        if scratch is not None:
            scratch[key] = shared
    return shared


def _after_quantizing(product: Callable[[], None], vec_dot_type: str, x: np.ndarray, shared: _SharedActivations,
                      x_source: Hashable | None) -> Callable[[], None]:
    """``product`` run after x is quantized into the shared buffers, unless they hold x's quantization already
    (the docstring of bind_mul_mat)."""
    quantize = entry_points.bind(_ACTIVATION_QUANTIZERS[vec_dot_type], x, *shared.buffers)
    token, first = shared.token_for(x_source, x)

    def run_quantized() -> None:
        if first or shared.holds is not token:
            quantize()
            shared.holds = token
        product()
    return run_quantized


class _SharedActivations:
    """One plan's activation buffers of one type and shape, and whose quantized x they hold now."""

    __slots__ = ("buffers", "holds", "_tokens")

    def __init__(self, buffers: tuple[np.ndarray, np.ndarray, np.ndarray]):
        self.buffers = buffers
        self.holds: tuple | None = None      # the token of the x last quantized into buffers (None: unknown)
        self._tokens: dict[tuple, tuple] = {}   # (x_source, x's address) -> itself, the first one bound

    def token_for(self, x_source: Hashable | None, x: np.ndarray) -> tuple[tuple | None, bool]:
        """(the token that marks x's quantization in the buffers, whether this is the first product bound for
        it). The first product quantizes at every run, so that no run takes the buffers for the x of a
        previous run; without an x_source every product is a first."""
        if x_source is None:
            return None, True
        key = (x_source, x.ctypes.data)
        token = self._tokens.setdefault(key, key)
        return token, token is key


def use_parallel(macs: int, n_threads: int) -> bool:
    """Whether a product of this many multiply-adds runs on numba's threads (see PARALLEL_MIN_MACS)."""
    return n_threads > 1 and macs >= PARALLEL_MIN_MACS


def _check_shapes(pw: PackedWeight, x: np.ndarray, out: np.ndarray) -> None:
    if x.ndim != 2 or x.shape[1] != pw.k:
        raise ShapeError(f"mul_mat: activations of shape {x.shape} do not match a weight of "
                         f"{pw.rows} rows x {pw.k} columns (want (n, {pw.k}))")
    n = x.shape[0]
    if out.shape != (n, pw.rows) or out.dtype != np.float32:
        raise ShapeError(f"mul_mat: out must be float32 of shape {(n, pw.rows)}, got {out.dtype} {out.shape}")


def quantize_activations(x: np.ndarray, vec_dot_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (n, k) f32 -> the kernels' split form of ``vec_dot_type``: (values int16 (n, k), scales
    f32 per block, extra) with extra = int32 block sums (Q8_0), f32 d*sum (Q8_1), int32 sums of
    16 (Q8_K). ``qmm.act.*_to_ggml_bytes`` turn these into ggml's block bytes."""
    n, k = x.shape
    xq = np.empty((n, k), np.int16)
    if vec_dot_type == "Q8_K":
        d = np.empty((n, k // 256), np.float32)
        extra = np.empty((n, k // 16), np.int32)
        act.quantize_q8_K(x, xq, d, extra)
        return xq, d, extra
    d = np.empty((n, k // 32), np.float32)
    if vec_dot_type == "Q8_1":
        extra = np.empty((n, k // 32), np.float32)
        act.quantize_q8_1(x, xq, d, extra)
    else:
        extra = np.empty((n, k // 32), np.int32)
        act.quantize_q8_0(x, xq, d, extra)
    return xq, d, extra


_ACTIVATION_QUANTIZERS = {"Q8_0": act.quantize_q8_0, "Q8_1": act.quantize_q8_1, "Q8_K": act.quantize_q8_K}


__all__ = ["SUPPORTED_TYPES", "PackedWeight", "pack_weight", "mul_mat", "bind_mul_mat", "bind_mul_mats", "can_group",
           "has_kernel", "cpu_pieces", "quantize_activations", "TILE"]
