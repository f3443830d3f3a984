"""Graph: the nodes (op results) and leafs (weights, inputs) reachable from some outputs, in topological order.

Built by forward expansion as ggml_build_forward_expand does: a depth-first walk from each output over
its sources, appending a tensor after all of its sources. Expanding several outputs in turn (the KV-cache
writes first, the logits last) fixes the order of side effects. Building allocates no data.
"""
from __future__ import annotations

import itertools
from typing import Iterable

from ggflow.core.tensor import Tensor, TensorFlag

_uids = itertools.count(1)


class Graph:
    def __init__(self, outputs: Iterable[Tensor] = ()):
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._seen: set[int] = set()
        self.uid = next(_uids)
        for t in outputs:  # what the graph is built for is read after compute: mark it so
            self.mark_output(t)

    def expand(self, tensor: Tensor) -> "Graph":
        """Add tensor and everything it depends on that is not in the graph yet."""
        # Iterative DFS: graphs of deep models would overflow Python's recursion limit.
        stack: list[tuple[Tensor, int]] = [(tensor, 0)]
        while stack:
            t, i = stack.pop()
            if t.id in self._seen:
                continue
            parents = t.src if t.view_src is None or t.view_src in t.src else (*t.src, t.view_src)
            if i < len(parents):
                stack.append((t, i + 1))
                if parents[i].id not in self._seen:
                    stack.append((parents[i], 0))
                continue
            self._seen.add(t.id)
            (self.leafs if t.is_leaf else self.nodes).append(t)
        return self

    def mark_output(self, tensor: Tensor) -> None:
        tensor.flags |= TensorFlag.OUTPUT
        self.expand(tensor)

    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in self.leafs if t.flags & TensorFlag.INPUT]

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, t: Tensor) -> bool:
        return t.id in self._seen

    def to_dot(self) -> str:
        """Graphviz source: leafs as boxes, nodes as ellipses, edges from source to consumer."""
        lines = [f'digraph "ggflow_graph_{self.uid}" {{', "  rankdir=TB;"]
        for t in self.leafs:
            lines.append(f'  t{t.id} [shape=box, label="{_label(t)}"];')
        for t in self.nodes:
            lines.append(f'  t{t.id} [label="{t.op}\\n{_label(t)}"];')
            for s in t.src:
                lines.append(f"  t{s.id} -> t{t.id};")
        lines.append("}")
        return "\n".join(lines)


def _label(t: Tensor) -> str:
    shape = "x".join(str(n) for n in t.ne[: t.n_dims])
    return f"{t.name or t.op} {t.type.name}[{shape}]".replace('"', "'")
