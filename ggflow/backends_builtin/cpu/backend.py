"""CPUBackend: runs every op on the host with numba and numpy kernels; the fallback of last resort.

compile() binds each node's kernel to numpy views of its sources and destination once, so running the
plan again (every decode step of a reused graph) costs one Python call per node, fewer where a chain of
nodes runs as one fused kernel (fusion.py) or products of one activation run as one (a layer's q, k and v:
products.matmul.bind_product_group). A plan runs with numpy's overflow and invalid warnings off:
kernels compute what ggml computes (an exp that overflows to inf, a row masked everywhere to NaN), and
one setting per run costs less than one per kernel. Kernels are imported on first compile, so
registering the backend (``ggflow plugins``) does not load numba.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, ClassVar, Mapping, Sequence

import numpy as np

from ggflow.backends_builtin.cpu import spare_cores
from ggflow.core.backend import Backend, BackendOptions, HostBuffer
from ggflow.core.ops import IN_PLACE, PURE_VIEWS, Op, plugin_op
from ggflow.core.tensor import Tensor
from ggflow.errors import BackendError

Kernel = Callable[[], None]
Binder = Callable[..., Kernel]


class CPUPlan:
    """A compiled run of nodes: their bound kernels, called in order, on as many of ``n_threads`` (None: numba's
    count) as other processes leave cores free (spare_cores)."""

    __slots__ = ("kernels", "n_threads", "ran")

    def __init__(self, kernels: list[Kernel], n_threads: int | None):
        self.kernels = kernels
        self.n_threads = n_threads
        self.ran = False

    def __call__(self) -> None:
        import numba
        previous = numba.get_num_threads()
        threads = spare_cores.threads_now(self.n_threads or numba.config.NUMBA_NUM_THREADS)
        if threads != previous:
            numba.set_num_threads(threads)
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                for kernel in self.kernels:
                    kernel()
        finally:
            spare_cores.in_use = 0      # no plan running: a product called on its own chooses freely
            if numba.get_num_threads() != previous:
                numba.set_num_threads(previous)
        if not self.ran:            # its kernels loaded (or compiled) on this first run: LLVM's work is done
            self.ran = True
            from ggflow.backends_builtin.cpu import jit_pages
            jit_pages.release_code_pages()


class CPUBackend(Backend):
    name: ClassVar[str] = "cpu"
    description: ClassVar[str] = "numba and numpy kernels on the host; runs every op (the fallback)"
    reads_host_memory: ClassVar[bool] = True   # its kernels read any host buffer where it lies
    host_memory: ClassVar[bool] = True

    def __init__(self, options: BackendOptions = BackendOptions()):
        """options.n_threads: numba threads for the parallel kernels (None: numba's default, all cores)."""
        super().__init__(options)
        n_threads = options.n_threads
        if n_threads is not None:
            import numba
            n_threads = min(int(n_threads), numba.config.NUMBA_NUM_THREADS)
        self.n_threads = n_threads
        self.fuse = True   # run chains of nodes as one kernel (fusion.py); off: one kernel per node
        self._weights = None  # PackedWeights, made on first use (it imports the kernels)

    def alloc_buffer(self, size: int) -> HostBuffer:
        return HostBuffer.allocate(size, self.name, self.alignment)

    def supports_op(self, node: Tensor) -> bool:
        return True

    @property
    def packed_weights(self):
        if self._weights is None:
            from ggflow.backends_builtin.cpu.products.matmul import PackedWeights, load_quant_matmul
            self._weights = PackedWeights(load_quant_matmul())
        return self._weights

    def prepare_weight(self, tensor: Tensor) -> None:
        """Pack a weight for the matmul kernels now, so the first compute doesn't (no-op if none apply)."""
        self.packed_weights.get(tensor)

    def adopt_weights(self, weights: Mapping[str, Tensor]) -> None:
        """Pack the weights (``prepare_weight``) with LLVM's code pages given back before and after
        (jit_pages.py): the peak then holds the packed copies without the ~68 MiB the JIT's start faulted in."""
        from ggflow.backends_builtin.cpu import jit_pages
        jit_pages.start_jit()
        jit_pages.release_code_pages()
        super().adopt_weights(weights)
        jit_pages.release_code_pages()

    def compile(self, nodes: Sequence[Tensor], substitutes: Mapping[Tensor, Tensor] | None = None) -> CPUPlan:
        from ggflow.backends_builtin.cpu.arrays import TensorArrays
        arrays = TensorArrays(substitutes)
        from ggflow.backends_builtin.cpu.ops.attention_pages import attention_chains, masked_products
        written = {n.view_src.base() for n in nodes if n.op in IN_PLACE and n.view_src is not None}
        binders = {**_kernel_binders(), Op.MUL_MAT: partial(_mul_mat_binder(), weights=self.packed_weights,
                                                              n_threads=self.n_threads,
                                                              masked=masked_products(nodes), written=written),
                   Op.MUL_MAT_ID: partial(_mul_mat_id_binder(), weights=self.packed_weights, n_threads=self.n_threads)}
        from ggflow.backends_builtin.cpu.fusion import bind_fused
        from ggflow.backends_builtin.cpu.products.matmul import bind_product_group
        steps = [n for n in nodes if n.op not in PURE_VIEWS and n.nelements != 0]   # views compute nothing
        attention = attention_chains(nodes) if self.fuse else {}
        kernels, i = [], 0
        while i < len(steps):
            fused = (bind_fused(steps, i, arrays, attention, self.n_threads)
                     or bind_product_group(steps, i, arrays, self.packed_weights, self.n_threads, written)
                     ) if self.fuse else None
            if fused is not None:
                kernels.append(fused[0])
                i += fused[1]
                continue
            node = steps[i]
            bind = binders.get(node.op) or _reference_binder(node.op)
            if bind is None:
                raise BackendError(f"the cpu backend has no kernel for op {node.op!r} (node {node!r}) and no "
                                   f"plugin registered it (ggflow.core.ops.register_op); it runs: "
                                   f"{', '.join(sorted(binders))}")
            kernels.append(bind(node, arrays))
            i += 1
        return CPUPlan(kernels, self.n_threads)

    def compute(self, nodes: Sequence[Tensor], substitutes: Mapping[Tensor, Tensor] | None = None) -> None:
        self.compile(nodes, substitutes)()


def _kernel_binders() -> dict[Op, Binder]:
    from ggflow.backends_builtin.cpu.ops import rows as kernels_rows
    from ggflow.backends_builtin.cpu.ops import elementwise as kernels_elementwise
    from ggflow.backends_builtin.cpu.ops import norm as kernels_norm
    from ggflow.backends_builtin.cpu.ops import rope as kernels_rope
    from ggflow.backends_builtin.cpu.ops import routing as kernels_routing
    from ggflow.backends_builtin.cpu.ops import softmax as kernels_softmax
    return {
        Op.ADD: kernels_elementwise.bind_add,
        Op.MUL: kernels_elementwise.bind_mul,
        Op.SCALE: kernels_elementwise.bind_scale,
        Op.SILU: kernels_elementwise.bind_silu,
        Op.GELU: kernels_elementwise.bind_gelu,
        Op.TANH: kernels_elementwise.bind_tanh,
        Op.RMS_NORM: kernels_norm.bind_rms_norm,
        Op.NORM: kernels_norm.bind_norm,
        Op.ROPE: kernels_rope.bind_rope,
        Op.SOFT_MAX: kernels_softmax.bind_soft_max,
        Op.GET_ROWS: kernels_rows.bind_get_rows,
        Op.SET_ROWS: kernels_rows.bind_set_rows,
        Op.CPY: kernels_rows.bind_cpy,
        Op.CONT: kernels_rows.bind_cont,
        Op.ARGSORT: kernels_routing.bind_argsort,
        Op.SIGMOID: kernels_routing.bind_sigmoid,
        Op.SUM_ROWS: kernels_routing.bind_sum_rows,
        Op.DIV: kernels_routing.bind_div,
        Op.CLAMP: kernels_routing.bind_clamp,
        Op.CONCAT: kernels_routing.bind_concat,
        Op.ADD_ID: kernels_routing.bind_add_id,
        Op.SOFT_MAX_SINKS: kernels_routing.bind_soft_max_sinks,
    }


def _reference_binder(op: str) -> Binder | None:
    """A plugin op runs its registered reference implementation (numpy or numba) here."""
    spec = plugin_op(op)
    if spec is None:
        return None
    from ggflow.backends_builtin.cpu.ops.reference import bind_reference
    return partial(bind_reference, spec=spec)


def _mul_mat_binder() -> Binder:
    from ggflow.backends_builtin.cpu.products.matmul import bind_mul_mat
    return bind_mul_mat


def _mul_mat_id_binder() -> Binder:
    from ggflow.backends_builtin.cpu.products.mul_mat_id import bind_mul_mat_id
    return bind_mul_mat_id
