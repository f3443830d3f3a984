"""Context.decode(batch): the inference loop.

Run the memory's pending work (the K-shift) on the Context's scheduler, then place the whole batch in
the memory as one transaction (no room: status 1, memory untouched). For each ubatch: reuse a graph built
for the same shape parameters (n_tokens, n_outputs, n_kv; the last GRAPHS_KEPT shapes are kept, allocated
in the scheduler's shared compute buffers) or build and allocate a new one, set the inputs (token ids,
positions, the memory's KV indices and mask, output ids), compute, and keep the logits of the tokens that
asked for them. The transaction commits when every ubatch has run; an exception rolls back everything the
batch did.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ggflow.core.backend_registry import make_backends
from ggflow.core.batch import Batch, BatchError, UBatch, sequences_of
from ggflow.core.graph import Graph
from ggflow.core.graph_builder import GraphBuilder
from ggflow.core.memory import MAX_SEQ, Memory, Slot
from ggflow.core.model import Model
from ggflow.core.placement import kv_writes, memory_backend
from ggflow.core.scheduler import Scheduler
from ggflow.core.tensor import Tensor
from ggflow.errors import BackendError, PluginError

DECODE_OK = 0
DECODE_NO_KV_SLOT = 1   # llama.cpp's contract: the batch did not fit; nothing changed
# Graphs kept ready, by shape. One was enough for a single sequence (a prompt, then one decode shape); a
# serving loop alternates: its slots' decode shape, a step that also carries a new prompt's chunk, then the
# decode shape again, and each switch rebuilt and recompiled a graph (~20 ms for SmolLM2's 1054 nodes,
# docs/performance.md, "Per-step overhead"). They share the compute buffers, so a kept graph costs its
# Python objects and compiled plan (~1 MiB for SmolLM2's), not memory for its tensors. Four were too few for
# four clients whose requests start and end at different steps: the shapes of a round (decode shapes at each
# attended range, steps with a prompt's chunk, fewer slots as requests end) outnumber them, and each came
# back evicted (46 builds, 1 s of a 9 s run; with 16: 9-13 builds, 0.2-0.3 s: "Eleventh session" under Serving).
GRAPHS_KEPT = 16


@dataclass
class _BuiltGraph:
    key: tuple   # n_tokens, n_outputs, n_kv, embeddings, the LoRA adapters in use
    graph: Graph
    builder: GraphBuilder
    logits: Tensor


class Context:
    def __init__(self, model: Model, n_ctx: int | None = None, n_ubatch: int = 512,
                 type_k: str = "F16", type_v: str = "F16", backends: "str | Sequence[str]" = "auto",
                 n_threads: int | None = None):
        self.model = model
        self.n_ctx = int(n_ctx or min(model.hparams.n_ctx_train, 4096))
        self.n_ubatch = max(1, min(n_ubatch, self.n_ctx))
        self.backends = make_backends(backends, n_threads)
        self.backends[0].adopt_weights(model.weights)   # a device backend uploads them once, here
        self.scheduler = Scheduler(self.backends)
        # the KV cache lives on the first backend that can write its rows (placement.py); the CPU otherwise
        writes = kv_writes(model.hparams, self.n_ctx, self.n_ubatch, type_k, type_v)
        self.memory_backend = memory_backend(self.backends, writes)
        self.memory = model.arch.create_memory(model.hparams, self.n_ctx, self.memory_backend, type_k, type_v,
                                               self.n_ubatch)
        if not isinstance(self.memory, Memory):
            raise PluginError(f"{type(model.arch).__name__}.create_memory returned a {type(self.memory).__name__}, "
                              f"not a ggflow.core.memory.Memory")
        self._graphs: OrderedDict[tuple, _BuiltGraph] = OrderedDict()   # by key, the most recently used last
        self.n_graph_builds = 0
        self.n_graph_reuses = 0
        self.embeddings = False   # outputs are hidden states (get_embeddings), not logits: set_embeddings
        self._logits = np.zeros((0, model.hparams.n_vocab), np.float32)
        self._logit_row: dict[int, int] = {}   # batch index -> row of _logits
        self.lora = None   # the LoRA adapters and each sequence's mix of them (lora_mix.LoraSet): set_lora

    # -- validation ----------------------------------------------------------------------------
    def _validate(self, batch: Batch) -> None:
        hp = self.model.hparams
        if batch.n_tokens == 0:
            raise BatchError("the batch is empty")
        if batch.n_tokens > self.n_ctx:
            raise BatchError(f"the batch has {batch.n_tokens} tokens, more than the context size {self.n_ctx}")
        if batch.tokens.min() < 0 or batch.tokens.max() >= hp.n_vocab:
            bad = np.flatnonzero((batch.tokens < 0) | (batch.tokens >= hp.n_vocab))
            raise BatchError(f"token id {int(batch.tokens[bad[0]])} at batch index {int(bad[0])} is outside "
                             f"the vocabulary [0, {hp.n_vocab})")
        n_seq_max = self.memory.n_seq_max
        if batch.seq_id.min() < 0 or batch.seq_id.max() >= n_seq_max:
            raise BatchError(f"sequence ids must be in [0, {n_seq_max})")
        if batch.pos.min() < 0:
            raise BatchError("positions must be non-negative")
        seqs = sequences_of(batch.seq_id)
        for s in seqs:
            pos = batch.pos[batch.seq_id == s] if len(seqs) > 1 else batch.pos
            if len(pos) > 1 and (np.diff(pos) != 1).any():
                raise BatchError(f"positions of sequence {s} in the batch must increase by one: {pos.tolist()}")
            last = self.memory.seq_pos_max(int(s))
            if last >= 0 and pos[0] != last + 1:
                raise BatchError(f"sequence {s} ends at position {last} in the KV cache; the batch must continue "
                                 f"at {last + 1}, not {pos[0]} (remove positions with seq_rm to rewrite them)")
            if hp.n_rot == 0 and pos[-1] >= hp.n_ctx_train:
                raise BatchError(f"position {pos[-1]} is beyond the model's {hp.n_ctx_train} learned positions")

    # -- decoding ------------------------------------------------------------------------------
    def decode(self, batch: Batch) -> int:
        """Evaluate a batch. 0: done; 1: the KV cache has no room for it (cache unchanged)."""
        self._validate(batch)
        if self.memory.n_free < batch.n_tokens:
            return DECODE_NO_KV_SLOT
        if self.memory.update(self.scheduler):
            self._forget_graphs()   # the update's graph was allocated on the scheduler: ours are allocated again
        placed = self.memory.begin(batch.split(self.n_ubatch))
        if placed is None:
            return DECODE_NO_KV_SLOT
        outputs: list[np.ndarray] = []
        with placed:
            for ub, slot in placed:
                outputs.append(self._compute_ubatch(ub, slot))
            placed.commit()
        # each ubatch's outputs are a fresh copy (Backend.get_tensor): one of them is kept as it is
        self._logits = outputs[0] if len(outputs) == 1 else np.concatenate(outputs) if outputs else self._logits[:0]
        self._logit_row = {int(i): r for r, i in enumerate(np.flatnonzero(batch.logits))}
        return DECODE_OK

    def _graph_for(self, ub: UBatch, n_kv: int) -> _BuiltGraph:
        active = self.lora.active(ub.seq_id) if self.lora is not None else ()
        key = (ub.n_tokens, ub.n_outputs, n_kv, self.embeddings, active)
        built = self._graphs.get(key)
        if built is not None:
            if self.scheduler.graph is built.graph or self.scheduler.use(built.graph):
                self._graphs.move_to_end(key)
                self.n_graph_reuses += 1
                return built
            del self._graphs[key]   # its memory was replaced by a larger graph's: built again below
        builder = GraphBuilder(self.model, self.memory, ub.n_tokens, ub.n_outputs, n_kv,
                               embeddings=self.embeddings)
        if active:
            builder.lora = self.lora.graph(active, ub.n_tokens, builder.inp_out_ids)
        logits = builder.output(self.model.arch.build_graph(builder))
        graph = builder.finish(logits)
        self.scheduler.alloc(graph)
        self.n_graph_builds += 1
        built = self._graphs[key] = _BuiltGraph(key, graph, builder, logits)
        while len(self._graphs) > GRAPHS_KEPT:
            self.scheduler.forget(self._graphs.popitem(last=False)[1].graph)
        return built

    def _forget_graphs(self) -> None:
        for built in self._graphs.values():
            self.scheduler.forget(built.graph)
        self._graphs.clear()

    def _compute_ubatch(self, ub: UBatch, slot: Slot) -> np.ndarray:
        built = self._graph_for(ub, slot.n_kv)
        b, sched = built.builder, self.scheduler
        inputs = {
            b.inp_tokens: ub.tokens,
            b.inp_pos: ub.pos,
            b.inp_out_ids: np.flatnonzero(ub.logits).astype(np.int32),
            **self.memory.input_data(b.inp_memory, ub, slot),
            **(self.lora.input_data(b.lora, ub) if b.lora is not None else {}),
        }
        for tensor, data in inputs.items():
            if tensor in built.graph:  # an architecture may not use every input (gpt2: no RoPE)
                sched.set_input(tensor, data)
        sched.compute(built.graph)
        if ub.n_outputs == 0:
            hp = self.model.hparams
            return np.zeros((0, hp.n_embd if self.embeddings else hp.n_vocab), np.float32)
        return sched.get_output(built.logits).reshape(ub.n_outputs, -1)

    def set_lora(self, adapters: Sequence, scales: Sequence[float]) -> None:
        """Use these LoRA adapters (ggflow.core.lora.load_lora), each sequence at ``scales`` until given its own
        mix (``self.lora.set_sequence``); no adapters: none. The graphs are built again."""
        from ggflow.core.lora_mix import LoraSet

        self.lora = LoraSet(adapters, scales, getattr(self.memory, "n_seq_max", MAX_SEQ)) if adapters else None
        for adapter in adapters:
            self.backends[0].adopt_weights(adapter.tensors)
        self._forget_graphs()

    # -- results -------------------------------------------------------------------------------
    def get_logits(self) -> np.ndarray:
        """Logits of the last decode's output tokens, [n_outputs, n_vocab], in batch order."""
        return self._logits

    def set_embeddings(self, on: bool) -> None:
        """Whether decode outputs the final hidden states (after the output norm) instead of logits
        (llama_set_embeddings); the graph is rebuilt for the other output."""
        self.embeddings = bool(on)

    def get_embeddings(self) -> np.ndarray:
        """Hidden states of the last decode's output tokens, [n_outputs, n_embd], in batch order."""
        if not self.embeddings:
            raise BatchError("the context outputs logits: set_embeddings(True) before decoding for embeddings")
        return self._logits

    def get_logits_ith(self, i: int) -> np.ndarray:
        """Logits of batch token i (negative: from the end of the outputs)."""
        if i < 0:
            i = sorted(self._logit_row)[i]
        if i not in self._logit_row:
            raise BatchError(f"batch token {i} did not ask for logits")
        return self._logits[self._logit_row[i]]

    # -- memory ----------------------------------------------------------------------------------
    def clear(self) -> None:
        self.memory.clear()

    @property
    def n_ctx_used(self) -> int:
        return self.memory.n_used
