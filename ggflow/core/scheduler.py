"""Scheduler: place each graph node on a backend, split the graph into per-backend runs, copy across.

Placement, in the spirit of ggml_backend_sched:
  1. a tensor that already has memory (a weight, the KV cache) lives where its buffer is; a view, and
     an op that writes in place (set_rows, cpy), runs where the memory it views lives;
  2. a node that reads a weight runs where the weight lives, if that backend supports it;
  3. the rest follow their sources: the highest-priority backend among the sources' that supports it;
     then their consumers'; then the highest-priority backend that supports the op at all;
  4. the last backend (the CPU) takes what nothing else supports.
Consecutive nodes on one backend form a split. A split reads a tensor that lives elsewhere through a
copy made at the split's start; the copy is what the split's kernels see (``substitutes``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ggflow.core.alloc import NEVER, Lifetime, plan_offsets
from ggflow.core.backend import Backend, Buffer
from ggflow.core.graph import Graph
from ggflow.core.ops import IN_PLACE
from ggflow.core.tensor import MAX_DIMS, Tensor, TensorFlag
from ggflow.errors import BackendError


@dataclass
class Copy:
    src: Tensor         # where the data lives now (another backend)
    dst: Tensor         # its contiguous copy in the split's backend memory


@dataclass
class Split:
    backend: Backend
    nodes: list[Tensor]
    copies: list[Copy] = field(default_factory=list)
    plan: Callable[[], None] | None = None

    @property
    def substitutes(self) -> dict[Tensor, Tensor]:
        return {c.src: c.dst for c in self.copies}


class Scheduler:
    def __init__(self, backends: Sequence[Backend]):
        """backends in order of preference; the last one is the fallback that must support every op."""
        if not backends:
            raise BackendError("the scheduler needs at least one backend")
        self.backends = list(backends)
        self._by_buffer_name = {b.name: b for b in self.backends}
        self._buffers: dict[str, Buffer] = {}      # compute buffer per backend, grown when needed
        self.graph: Graph | None = None
        self.splits: list[Split] = []
        self.home: dict[int, Backend] = {}          # tensor id -> backend whose memory holds it
        self.n_allocs = 0                           # times a graph was (re)allocated

    # -- placement -------------------------------------------------------------------------------
    def _buffer_backend(self, t: Tensor) -> Backend:
        name = t.base().buffer.backend_name  # type: ignore[union-attr]
        if name not in self._by_buffer_name:
            raise BackendError(f"{t!r} lives in a {name!r} buffer but no {name!r} backend is scheduled")
        return self._by_buffer_name[name]

    def assign(self, graph: Graph) -> dict[int, Backend]:
        """Backend of every node and every leaf that has (or will get) memory in the graph."""
        home: dict[int, Backend] = {}
        for leaf in graph.leafs:
            if leaf.base().buffer is not None:
                home[leaf.id] = self._buffer_backend(leaf)
        fallback = self.backends[-1]

        def supported(b: Backend, node: Tensor) -> bool:
            return b.supports_op(node)

        for node in graph.nodes:  # pass 1: memory owners and weights
            if node.view_src is not None:
                owner = home.get(node.view_src.id)
                if owner is not None:
                    if node.op in IN_PLACE and not supported(owner, node):
                        raise BackendError(f"{node.op} writes into {node.view_src!r} on {owner.name}, "
                                           f"which does not support it")
                    home[node.id] = owner
                continue
            for src in node.src:
                if src.is_leaf and src.flags & TensorFlag.PARAM and src.id in home \
                        and supported(home[src.id], node):
                    home[node.id] = home[src.id]
                    break

        for node in graph.nodes:  # pass 2: follow the sources
            if node.id in home:
                continue
            if node.view_src is not None and node.view_src.id in home:
                home[node.id] = home[node.view_src.id]
                continue
            cands = [home[s.id] for s in node.src if s.id in home and supported(home[s.id], node)]
            if cands:
                home[node.id] = min(cands, key=self.backends.index)

        consumers: dict[int, list[Tensor]] = {}
        for node in graph.nodes:
            for s in node.src:
                consumers.setdefault(s.id, []).append(node)
        for node in reversed(graph.nodes):  # pass 3: follow the consumers, then any that supports it
            if node.id in home:
                continue
            cands = [home[c.id] for c in consumers.get(node.id, []) if c.id in home
                     and supported(home[c.id], node)]
            cands += [b for b in self.backends if supported(b, node)]
            home[node.id] = min(cands, key=self.backends.index) if cands else fallback

        for leaf in graph.leafs:  # graph inputs live with their first consumer
            if leaf.id not in home:
                first = next((n for n in graph.nodes if leaf in n.src), None)
                home[leaf.id] = home[first.id] if first is not None else fallback
        return home

    def split(self, graph: Graph, home: dict[int, Backend]) -> list[Split]:
        splits: list[Split] = []
        for node in graph.nodes:
            backend = home[node.id]
            if not splits or splits[-1].backend is not backend:
                splits.append(Split(backend, []))
            split = splits[-1]
            split.nodes.append(node)
            for src in _reads(node):
                if home[src.id] is not backend and all(c.src is not src for c in split.copies):
                    dst = Tensor(src.type, src.ne, name=f"{src.name or src.op}->{backend.name}")
                    split.copies.append(Copy(src, dst))
        return splits

    # -- memory ----------------------------------------------------------------------------------
    def alloc(self, graph: Graph) -> None:
        """Place, split and allocate a graph; prepare each split's plan. Call once per new graph."""
        home = self.assign(graph)
        splits = self.split(graph, home)
        lifetimes = _lifetimes(graph, splits, home)
        placed, sizes = plan_offsets(lifetimes, {b.name: b.alignment for b in self.backends})
        for backend in self.backends:
            need = sizes.get(backend.name, 0)
            have = self._buffers.get(backend.name)
            if need and (have is None or have.size < need):
                self._buffers[backend.name] = backend.alloc_buffer(need)
        for lt in lifetimes:
            pool, offset = placed[lt.tensor.id]
            lt.tensor.buffer, lt.tensor.offset = self._buffers[pool], offset
        for split in splits:
            home.update({c.dst.id: split.backend for c in split.copies})
            split.plan = split.backend.compile(split.nodes, split.substitutes)
        self.graph, self.splits, self.home = graph, splits, home
        self.n_allocs += 1

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
                split.backend.set_tensor(c.dst, self.home[c.src.id].get_tensor(c.src))
            split.plan()  # type: ignore[misc]
        for backend in self.backends:
            backend.synchronize()

    def get_output(self, tensor: Tensor) -> np.ndarray:
        """A host copy of a computed tensor, shaped like numpy (ne reversed, trailing 1-dims dropped)."""
        data = self.home[tensor.id].get_tensor(tensor)
        return data.reshape(data.shape[MAX_DIMS - tensor.n_dims:])


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
