"""Scheduler: place each graph node on a backend, split the graph into per-backend runs, copy across.

Placement follows ggml_backend_sched (ggml-backend.cpp, ``ggml_backend_sched_split_graph``); the rules
and what they cost are in docs/backends.md:
  1. a tensor that already has memory (a weight, the KV cache) lives where its buffer is; a view, and
     an op that writes in place (set_rows, cpy), runs where the memory it views lives;
  2. a node that reads a weight runs where the weight lives, if that backend supports it, unless the
     weight lives on the fallback (the CPU): then an earlier backend that supports the node and wants
     it (``Backend.offload_op``) takes it, as ggml's op offload does;
  3. the rest expand from their neighbours, down and up the graph: first from every backend but the
     fallback, then from every backend; a node still without one goes to the backend, among those that
     support it, that holds most of its sources; a view lives with what it views;
  4. a node left on the fallback whose sources all lie in host memory goes to a backend that reads host
     memory where it lies (ggml's supports_buft) and supports it, the cheapest by the cost it reports
     (``Backend.op_cost``, below the CPU's 1.0), the earlier by priority on a tie: a backend that holds no
     weights (an F32 matmul library) gets the nodes it can run;
  5. the last backend (the CPU) takes what nothing else supports.
``Scheduler.why`` keeps each node's reason, ``Split.reason`` a split's, for ``ggflow run --verbose``.
``Scheduler.observer`` (ggml's eval callback, as llama-imatrix uses it): the nodes it ``wants`` in a graph
keep their sources' memory to the end of the compute, and after each compute it ``observe``s each of them
with host copies of its sources.
Consecutive nodes on one backend form a split. A split reads a tensor that lives elsewhere through a
copy made at the split's start; the copy is what the split's kernels see (``substitutes``). A weight
read on another backend is copied there once and the copy kept for every later graph (ggml copies it
at every compute); a weight is a PARAM leaf that no graph writes (the KV cache is written by its
graphs). ``stats`` counts the splits, the copies and their bytes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from ggflow.core.alloc import NEVER, Lifetime, plan_offsets
from ggflow.core.backend import Backend, Buffer
from ggflow.core.graph import Graph
from ggflow.core.ops import IN_PLACE, Op
from ggflow.core.tensor import MAX_DIMS, Tensor, TensorFlag
from ggflow.errors import BackendError

# ggml skips these when it places by weights: rope's frequency table is too small to choose by
NOT_PLACED_BY_WEIGHTS = frozenset({Op.ROPE})
WEIGHT_BUFFER_BYTES = 256 << 20   # weights copied to a backend share buffers of about this size


@dataclass
class Copy:
    src: Tensor         # where the data lives now (another backend)
    dst: Tensor         # its contiguous copy in the split's backend memory


@dataclass
class Split:
    backend: Backend
    nodes: list[Tensor]
    copies: list[Copy] = field(default_factory=list)          # made at every compute
    weight_copies: list[Copy] = field(default_factory=list)   # made once, kept by the scheduler
    plan: Callable[[], None] | None = None
    reasons: dict[str, int] = field(default_factory=dict)   # why its nodes are here: reason -> count

    @property
    def reason(self) -> str:
        """Why the split runs where it does: its nodes' reasons, the commonest first."""
        ranked = sorted(self.reasons.items(), key=lambda kv: -kv[1])
        return "; ".join(f"{n} x {why}" if n > 1 else why for why, n in ranked)

    @property
    def substitutes(self) -> dict[Tensor, Tensor]:
        return {c.src: c.dst for c in (*self.weight_copies, *self.copies)}


@dataclass
class SchedulerStats:
    """What the scheduler does: per compute of the graph allocated last, and totals since it was made."""
    n_splits: int = 0              # runs of consecutive nodes on one backend, in the current graph
    n_copies: int = 0              # tensors copied between backends at each compute of the current graph
    bytes_copied: int = 0          # bytes those copies move at each compute
    nodes: dict[str, int] = field(default_factory=dict)   # nodes of the current graph per backend
    n_computes: int = 0            # computes run, every graph
    total_copies: int = 0          # copies made by those computes
    total_bytes_copied: int = 0
    n_weight_copies: int = 0       # weights copied once to a backend that runs nodes reading them
    weight_bytes_copied: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line for a log: ``ggflow run --verbose`` prints it."""
        nodes = ", ".join(f"{name} {n}" for name, n in self.nodes.items())
        return (f"scheduler:   {self.n_splits} split(s) ({nodes} nodes); per compute {self.n_copies} copies, "
                f"{self.bytes_copied} bytes; over {self.n_computes} computes {self.total_copies} copies, "
                f"{self.total_bytes_copied} bytes; weights copied once: {self.n_weight_copies}, "
                f"{self.weight_bytes_copied} bytes")


class Observer(Protocol):
    """Sees chosen nodes' inputs after each compute (ggml_backend_sched_eval_callback's two calls)."""

    def wants(self, node: Tensor) -> bool:
        """Asked once per node when a graph is allocated: observe this node after each compute?"""

    def observe(self, node: Tensor, sources: list[np.ndarray]) -> None:
        """After a compute: host copies of node.src[1:] (numpy order: ne reversed, 4 axes)."""


class Scheduler:
    def __init__(self, backends: Sequence[Backend]):
        """backends in order of preference; the last one is the fallback that must support every op."""
        if not backends:
            raise BackendError("the scheduler needs at least one backend")
        self.backends = list(backends)
        self._by_buffer_name = {b.name: b for b in self.backends}
        self._buffers: dict[str, Buffer] = {}      # compute buffer per backend, grown when needed
        self._weight_copies: dict[tuple[int, str], Copy] = {}   # (weight id, backend name) -> its copy
        self._written: set[int] = set()             # PARAM tensors a graph wrote: never weights
        self.graph: Graph | None = None
        self.splits: list[Split] = []
        self.home: dict[int, Backend] = {}          # tensor id -> backend whose memory holds it
        self.why: dict[int, str] = {}               # node id -> why it runs on its backend (assign)
        # graphs allocated in the current buffers, which use() can make current again: graph -> (splits, home)
        self._allocated: dict[Graph, tuple[list[Split], dict[int, Backend]]] = {}
        self.n_allocs = 0                           # times a graph was (re)allocated
        self.stats = SchedulerStats()
        self.observer: Observer | None = None       # set before the graphs it should see are allocated
        self._observed: dict[Graph, list[Tensor]] = {}

    # -- placement -------------------------------------------------------------------------------
    def _buffer_backend(self, t: Tensor) -> Backend:
        name = t.base().buffer.backend_name  # type: ignore[union-attr]
        if name not in self._by_buffer_name:
            raise BackendError(f"{t!r} lives in a {name!r} buffer but no {name!r} backend is scheduled")
        return self._by_buffer_name[name]

    def weights(self, graph: Graph) -> set[int]:
        """Ids of the graph's weights: PARAM leaves with memory that no graph writes in place."""
        self._written |= {n.view_src.base().id for n in graph.nodes if n.op in IN_PLACE and n.view_src is not None}
        for key in [k for k in self._weight_copies if k[0] in self._written]:
            del self._weight_copies[key]   # written after all: a kept copy would go stale
        return {leaf.id for leaf in graph.leafs if leaf.flags & TensorFlag.PARAM and leaf.buffer is not None
                and leaf.view_src is None and leaf.id not in self._written}

    def _weight_reader(self, node: Tensor, owner: Backend) -> tuple[Backend, str] | None:
        """Where a node that reads a weight held by ``owner`` runs, and why (None: the later passes place it)."""
        if owner is self.backends[-1]:
            for b in self.backends[:-1]:
                if b.supports_op(node) and b.offload_op(node):
                    return b, f"offload_op: takes a node reading a {owner.name} weight"
        return (owner, "reads a weight held here") if owner.supports_op(node) else None

    def assign(self, graph: Graph, weights: set[int] | None = None) -> dict[int, Backend]:
        """Backend of every node and every leaf that has (or will get) memory in the graph; each node's
        reason goes to ``self.why``."""
        weights = self.weights(graph) if weights is None else weights
        home: dict[int, Backend] = {}
        why: dict[int, str] = {}
        for leaf in graph.leafs:
            if leaf.base().buffer is not None:
                home[leaf.id] = self._buffer_backend(leaf)
        fallback = self.backends[-1]

        def supported(b: Backend, node: Tensor) -> bool:
            return b.supports_op(node)

        def with_its_memory(node: Tensor) -> None:
            owner = home[node.view_src.id]  # type: ignore[union-attr]
            if node.op in IN_PLACE and not supported(owner, node):
                raise BackendError(f"{node.op} writes into {node.view_src!r} on {owner.name}, "
                                   f"which does not support it")
            home[node.id] = owner
            why[node.id] = "views or writes memory held here"

        for node in graph.nodes:  # pass 1: memory owners and weights
            if node.view_src is not None:
                root = node.base()
                if node.view_src.id in home:
                    with_its_memory(node)
                elif node.op in IN_PLACE and root.id not in home:
                    # a write into a graph input: the input's memory goes where it can be written
                    home[node.id] = home[root.id] = next((b for b in self.backends if supported(b, node)), fallback)
                    why[node.id] = "writes a graph input: the first backend that supports the write"
                continue
            if node.op in NOT_PLACED_BY_WEIGHTS:
                continue
            for src in node.src:
                base = src.base()
                if base.id in weights:
                    reader = self._weight_reader(node, home[base.id])
                    if reader is not None:
                        home[node.id], why[node.id] = reader
                        break
        computing = [n for n in graph.nodes if n.view_src is None]   # views and writes follow their memory
        # pass 2: expand to neighbours, as ggml does: first each backend but the fallback, down then up
        # the graph (so the CPU runs only what reads its weights, or what nothing before it supports),
        # then every backend; a node the neighbour's backend doesn't support waits for pass 3
        for skip_fallback in (True, False):
            for order in (computing, computing[::-1]):
                current: Backend | None = None
                for node in order:
                    if node.id in home:
                        current = None if skip_fallback and home[node.id] is fallback else home[node.id]
                    elif current is not None and supported(current, node):
                        home[node.id], why[node.id] = current, "follows its neighbours"

        for node in computing:  # pass 3: the backend that holds most of its sources, of those that support it
            if node.id not in home:
                able = [b for b in self.backends if supported(b, node)] or [fallback]
                home[node.id] = max(able, key=lambda b: sum(home.get(s.id) is b for s in node.src))
                why[node.id] = ("only the fallback supports it" if able == [fallback]
                                else "supported here, and holds most of its sources")

        readers = [b for b in self.backends[:-1] if b.reads_host_memory]
        for node in computing if readers else ():  # pass 4: host-memory readers take what the CPU would run
            if home[node.id] is fallback and node.op not in IN_PLACE:
                chosen = self._cheapest_reader(node, readers, home, weights)
                if chosen is not None:
                    home[node.id], cost = chosen
                    why[node.id] = f"reads its sources in host memory, op_cost {cost:g} < {fallback.name}'s 1"

        for leaf in graph.leafs:  # pass 5: graph inputs live with their first placed consumer,
            if leaf.id not in home:  # views and in-place writes with the memory they view
                home[leaf.id] = next((home[n.id] for n in graph.nodes if n.id in home
                                      and any(src.base() is leaf for src in n.src)), fallback)
        for node in graph.nodes:
            if node.id not in home:
                with_its_memory(node)
        self.why = why
        return home

    def _cheapest_reader(self, node: Tensor, readers: list[Backend], home: dict[int, Backend],
                         weights: set[int]) -> tuple[Backend, float] | None:
        """The host-memory reader with the lowest op_cost below 1 that supports the node and reads each
        of its sources where it lies (a source not placed yet is a graph input: it will live with it)."""
        best: tuple[Backend, float] | None = None
        for b in readers:
            if not all(s.base().id not in home or b.reads_memory_of(home[s.base().id])
                       and (s.id not in home or b.reads_memory_of(home[s.id])) for s in _reads(node)):
                continue
            if not b.supports_op(node):
                continue
            cost = b.op_cost(node)
            if cost is not None and cost < 1.0 and (best is None or cost < best[1]):
                best = (b, cost)
        return best

    def split(self, graph: Graph, home: dict[int, Backend], weights: set[int] = frozenset()) -> list[Split]:
        splits: list[Split] = []
        for node in graph.nodes:
            backend = home[node.id]
            if not splits or splits[-1].backend is not backend:
                splits.append(Split(backend, []))
            split = splits[-1]
            split.nodes.append(node)
            for src in _reads(node):
                base = src.base()
                if backend.reads_memory_of(home[base.id]) and backend.reads_memory_of(home[src.id]):
                    continue   # read where it lies (its own memory, or host memory it reads)
                if base.id in weights:  # a weight, or a view of one: read its kept copy
                    if home[base.id] is not backend and all(c.src is not base for c in split.weight_copies):
                        split.weight_copies.append(self._weight_copy(base, backend))
                elif home[src.id] is not backend and all(c.src is not src for c in split.copies):
                    # the copy keeps the source's layout (ggml_dup_tensor_layout): a strided view is read
                    # with its own strides, and views of it map onto the copy at the same offsets
                    dst = Tensor(src.type, src.ne, src.nb, name=f"{src.name or src.op}->{backend.name}")
                    split.copies.append(Copy(src, dst))
        return splits

    def _weight_copy(self, weight: Tensor, backend: Backend) -> Copy:
        key = (weight.id, backend.name)
        if key not in self._weight_copies:  # memory and data come in _upload_weights
            self._weight_copies[key] = Copy(weight, Tensor(weight.type, weight.ne, name=f"{weight.name}->{backend.name}"))
        return self._weight_copies[key]

    def _upload_weights(self, splits: list[Split], home: dict[int, Backend]) -> None:
        """Give the weight copies made for these splits memory (one buffer per backend) and their data."""
        new: dict[str, list[Copy]] = {}
        for split in splits:
            for c in split.weight_copies:
                if c.dst.buffer is None and c not in new.setdefault(split.backend.name, []):
                    new[split.backend.name].append(c)
        for name, copies in new.items():
            backend = self._by_buffer_name[name]
            for chunk in _chunks(copies, backend.alignment):
                buffer = backend.alloc_buffer(sum(size for _, size in chunk))
                offset = 0
                for c, size in chunk:
                    c.dst.buffer, c.dst.offset = buffer, offset
                    backend.set_tensor(c.dst, home[c.src.id].get_tensor(c.src))
                    offset += size
                    self.stats.n_weight_copies += 1
                    self.stats.weight_bytes_copied += c.dst.nbytes

    # -- memory ----------------------------------------------------------------------------------
    def alloc(self, graph: Graph) -> None:
        """Place, split and allocate a graph; prepare each split's plan. Call once per new graph."""
        if self.observer is not None:   # their sources are read after the compute: keep them (never shared)
            self._observed[graph] = [n for n in graph.nodes if self.observer.wants(n)]
            for node in self._observed[graph]:
                for src in node.src[1:]:
                    src.flags |= TensorFlag.OUTPUT
        weights = self.weights(graph)
        home = self.assign(graph, weights)
        splits = self.split(graph, home, weights)
        lifetimes = _lifetimes(graph, splits, home)
        placed, sizes = plan_offsets(lifetimes, {b.name: b.alignment for b in self.backends})
        for backend in self.backends:
            need = sizes.get(backend.name, 0)
            have = self._buffers.get(backend.name)
            if need and (have is None or have.size < need):
                self._buffers[backend.name] = backend.alloc_buffer(need)
                self._allocated.clear()   # their tensors lie in the buffer just replaced
        for lt in lifetimes:
            pool, offset = placed[lt.tensor.id]
            lt.tensor.buffer, lt.tensor.offset = self._buffers[pool], offset
        self._upload_weights(splits, home)
        for split in splits:
            home.update({c.dst.id: split.backend for c in (*split.copies, *split.weight_copies)})
            split.plan = split.backend.compile(split.nodes, split.substitutes)
            for node in split.nodes:
                reason = self.why.get(node.id, "views or writes memory held here")
                split.reasons[reason] = split.reasons.get(reason, 0) + 1
        self.graph, self.splits, self.home = graph, splits, home
        self._allocated[graph] = (splits, home)
        self.n_allocs += 1
        self._count_graph(graph, splits, home)

    def use(self, graph: Graph) -> bool:
        """Make a graph allocated earlier current again, as it was: True. False where it must be allocated
        again: never allocated, forgotten, or placed in a buffer a larger graph has since replaced. Graphs
        allocated here share the compute buffers (each has its own offsets in them): only the current one
        computes, and a computation's inputs are set before it, so none needs another's contents."""
        state = self._allocated.get(graph)
        if state is None:
            return False
        self.graph, (self.splits, self.home) = graph, state
        self._count_graph(graph, *state)
        return True

    def forget(self, graph: Graph) -> None:
        """Drop what use() keeps of a graph (its plans, its splits)."""
        self._allocated.pop(graph, None)
        self._observed.pop(graph, None)

    def _count_graph(self, graph: Graph, splits: list[Split], home: dict[int, Backend]) -> None:
        stats = self.stats
        stats.n_splits = len(splits)
        stats.n_copies = sum(len(s.copies) for s in splits)
        stats.bytes_copied = sum(c.dst.nbytes for s in splits for c in s.copies)
        stats.nodes = {b.name: sum(home[n.id] is b for n in graph.nodes) for b in self.backends}

    @property
    def compute_buffer_sizes(self) -> dict[str, int]:
        return {name: buf.size for name, buf in self._buffers.items()}

    # -- running ---------------------------------------------------------------------------------
    def _check(self, graph: Graph) -> None:
        if self.graph is not graph:
            raise BackendError("this graph was not allocated by the scheduler: call alloc(graph) first")

    def set_input(self, tensor: Tensor, data: np.ndarray) -> None:
        self.home[tensor.id].set_tensor(tensor, data)

    def compute(self, graph: Graph) -> None:
        self._check(graph)
        for split in self.splits:
            for c in split.copies:
                self._copy(c, split.backend)
            split.plan()  # type: ignore[misc]
        for backend in self.backends:
            backend.synchronize()
        if self.observer is not None:
            for node in self._observed.get(graph, ()):
                self.observer.observe(node, [self.home[s.id].get_tensor(s) for s in node.src[1:]])
        self.stats.n_computes += 1
        self.stats.total_copies += self.stats.n_copies
        self.stats.total_bytes_copied += self.stats.bytes_copied

    def _copy(self, c: Copy, to: Backend) -> None:
        if c.src.is_contiguous():
            to.set_tensor(c.dst, self.home[c.src.id].get_tensor(c.src))
            return
        self.home[c.src.id].synchronize()
        base = c.src.base()   # a strided view: the bytes it spans, as they lie
        raw = base.buffer.read(base.offset + c.src.base_offset(), c.src.nbytes)  # type: ignore[union-attr]
        c.dst.buffer.write(c.dst.offset, raw)  # type: ignore[union-attr]

    def get_output(self, tensor: Tensor) -> np.ndarray:
        """A host copy of a computed tensor, shaped like numpy (ne reversed, trailing 1-dims dropped)."""
        data = self.home[tensor.id].get_tensor(tensor)
        return data.reshape(data.shape[MAX_DIMS - tensor.n_dims:])


def _chunks(copies: list[Copy], alignment: int) -> list[list[tuple[Copy, int]]]:
    """Copies grouped into buffers of at most WEIGHT_BUFFER_BYTES (a larger weight gets its own), each
    with its aligned size: few allocations, none larger than a device is likely to allow."""
    chunks: list[list[tuple[Copy, int]]] = [[]]
    total = 0
    for c in copies:
        size = -(-c.dst.nbytes // alignment) * alignment
        if chunks[-1] and total + size > WEIGHT_BUFFER_BYTES:
            chunks.append([])
            total = 0
        chunks[-1].append((c, size))
        total += size
    return chunks


def _reads(node: Tensor) -> tuple[Tensor, ...]:
    """Tensors whose memory a node reads or writes: its sources and, for a view, what it views."""
    if node.view_src is not None and node.view_src not in node.src:
        return (*node.src, node.view_src)
    return node.src


def _lifetimes(graph: Graph, splits: list[Split], home: dict[int, Backend]) -> list[Lifetime]:
    """Every tensor the graph must allocate, with the steps that write it first and read it last."""
    step_of: dict[int, int] = {}
    lifetimes: dict[int, Lifetime] = {}
    last_read: dict[int, int] = {}
    step = 0
    for leaf in graph.leafs:  # inputs: written before the graph runs, kept to the end
        if leaf.base().buffer is None:
            lifetimes[leaf.id] = Lifetime(leaf, home[leaf.id].name, 0, NEVER)
    for split in splits:
        step += 1
        for c in split.copies:
            lifetimes[c.dst.id] = Lifetime(c.dst, split.backend.name, step, step)
            last_read[c.src.base().id] = step
        for node in split.nodes:
            step += 1
            step_of[node.id] = step
            if node.view_src is None:
                keep = NEVER if node.flags & TensorFlag.OUTPUT else step
                lifetimes[node.id] = Lifetime(node, split.backend.name, step, keep)
            subs = split.substitutes
            for src in _reads(node):
                target = subs.get(src, src).base()
                last_read[target.id] = max(last_read.get(target.id, 0), step)
    for node in graph.nodes:  # an output that is a view keeps the memory it views
        if node.view_src is not None and node.flags & TensorFlag.OUTPUT and node.base().id in lifetimes:
            lifetimes[node.base().id].end = NEVER
    for tid, lt in lifetimes.items():
        if lt.end != NEVER:
            lt.end = max(lt.end, last_read.get(tid, lt.start))
    return list(lifetimes.values())
