"""``POST /v1/embeddings``: inputs evaluated in the engine thread, a piece per step, on a spare sequence.

The engine is the only code that touches the Context, so an embedding request is a side job the engine runs
a bounded piece of after each step's decode (``Engine.run_side``, generation/side_work.py): the generating
slots go on between pieces. A piece switches the Context to embeddings output, evaluates the next tokens of
an input on a sequence id no slot uses and reads their final hidden states; an input's sequence is removed
once it is pooled, so the slots' caches are untouched. As llama-server's OpenAI route, a causal model's
per-token states are mean-pooled (a model's own ``pooling_type`` wins) and the vectors are L2-normalized.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from ggflow.api.embeddings import l2_normalize, model_pooling_type, pool
from ggflow.api.encoder import embed_token_lists, fit_tokens, is_encoder, max_input_tokens, score_token_lists
from ggflow.core.batch import Batch
from ggflow.core.memory import MAX_SEQ
from ggflow.errors import GGFlowError
from ggflow.generation.side_work import SideJob
from ggflow.serving.request import QueueFullError

WAIT_FOR_CELLS_S = 30.0   # an input waits this long for the busy slots to free cells, then is refused (503)
MAX_RELEASES = 3          # times an input may give its cells back to the generating slots before a 503


def spare_sequence(engine: Any, taken: "set[int] | frozenset[int]" = frozenset()) -> int:
    """A sequence id of the cache that no slot uses (nor is in ``taken``)."""
    used = {slot.seq_id for slot in engine.slots} | set(taken)
    n_seq_max = int(getattr(engine.ctx.memory, "n_seq_max", MAX_SEQ))
    free = [s for s in range(n_seq_max) if s not in used]
    if not free:
        raise GGFlowError("every sequence of the KV cache is a slot: start the server with fewer slots (-np) "
                          "to serve embeddings")
    return free[0]


class EmbeddingJob(SideJob):
    """The inputs of one embeddings request, evaluated a piece at a time on a spare sequence of the cache.

    An input longer than a piece goes on from where the previous piece stopped (a causal model's states do
    not depend on what follows), its per-token states kept until its last piece, then pooled as a whole: the
    vector equals the one a single decode of the input gives. An input short of cells takes idle slots'
    cached prefixes, then waits for busy slots; after WAIT_FOR_CELLS_S (or with no slot busy) the job ends
    with QueueFullError (a 503: retry later). When the generating slots need the cells, the input gives them
    back and starts again later (MAX_RELEASES times, then a 503).
    """

    def __init__(self, engine: Any, token_lists: Sequence[list[int]]):
        super().__init__()
        self.engine, self.token_lists = engine, [list(t) for t in token_lists]
        kind = model_pooling_type(engine.ctx.model.metadata)
        self.kind = "mean" if kind == "none" else kind       # one vector per input, as OpenAI's route returns
        spare_sequence(engine)                   # a server whose slots take every sequence: refused now
        self.seq: int | None = None              # its own spare sequence, taken at its first piece
        self.vectors: list[list[float]] = []
        self.states: list[np.ndarray] = []       # the current input's per-token states so far
        self.n_done = 0                          # tokens of the current input in the cache
        self.t_waiting = time.monotonic()        # since when no piece could run
        self.n_released = 0                      # times the engine took the cells back (release_cells)

    def run_piece(self, n_tokens: int, n_free_cells: int) -> int:
        ctx = self.engine.ctx
        if self.seq is None:   # jobs run a piece each in turn: each needs a sequence of its own
            taken = {getattr(job, "seq", None) for job in self.engine.side.jobs()}
            try:
                self.seq = spare_sequence(self.engine, taken)
            except GGFlowError:
                return 0   # every spare sequence is another job's: wait for one to end
            if getattr(ctx, "lora", None) is not None:   # the LoRA adapters' default mix (POST /lora-adapters)
                ctx.lora.set_sequence(self.seq, ctx.lora.scales)
        tokens = self.token_lists[len(self.vectors)]
        if len(tokens) > self.engine._cache_size():
            raise QueueFullError(f"an input of {len(tokens)} tokens does not fit the KV cache "
                                 f"({self.engine._cache_size()} cells)")
        room = min(n_tokens, n_free_cells)
        if room <= 0:
            room = min(n_tokens, n_free_cells + self.engine._drop_idle_caches(1 - n_free_cells))
        if room <= 0:   # the busy slots hold the cells: wait for them, for a while
            if not self.engine._any_busy() or time.monotonic() - self.t_waiting > WAIT_FOR_CELLS_S:
                raise QueueFullError("the KV cache has no room for this input now: retry later")
            return 0
        self.t_waiting = time.monotonic()
        piece = tokens[self.n_done: self.n_done + room]
        ctx.set_embeddings(True)
        try:
            batch = Batch(np.asarray(piece, np.int32), np.arange(self.n_done, self.n_done + len(piece)),
                          np.full(len(piece), self.seq), np.ones(len(piece), bool))
            if ctx.decode(batch) != 0:
                raise QueueFullError("the KV cache has no room for this input now: retry later")
            self.states.append(np.asarray(ctx.get_embeddings()).copy())
        except BaseException:
            self._release()
            raise
        finally:
            ctx.set_embeddings(False)
        self.n_done += len(piece)
        if self.n_done == len(tokens):
            hidden = self.states[0] if len(self.states) == 1 else np.concatenate(self.states)
            self.vectors.append(l2_normalize(pool(hidden, self.kind)).tolist())
            self._release()
            if len(self.vectors) == len(self.token_lists):
                self.future.set_result(self.vectors)
        return len(piece)

    def cells_held(self) -> int:
        return self.n_done

    def release_cells(self) -> int:
        """The generating slots need the cells: the current input starts again later (a few times at most)."""
        n = self.n_done
        self._release()
        self.n_released += 1
        if self.n_released > MAX_RELEASES:
            super().abandon(QueueFullError("the KV cache is needed by the generating slots: retry later"))
        return n

    def abandon(self, exc: BaseException) -> None:
        self._release()
        super().abandon(exc)

    def _release(self) -> None:
        if self.n_done:
            self.engine.ctx.memory.seq_rm(self.seq, 0, -1)
        self.states, self.n_done = [], 0


class EncoderJob(SideJob):
    """An encoder's inputs (no cache: each input is evaluated whole), as many per piece as the budget holds
    (at least one); ``score``: the reranker's scores instead of embeddings."""

    def __init__(self, engine: Any, token_lists: Sequence[list[int]], score: bool = False):
        super().__init__()
        self.engine, self.score = engine, score
        ctx = engine.ctx
        kind = model_pooling_type(ctx.model.metadata)
        self.kind = "mean" if kind == "none" else kind
        if not score:
            limit = max_input_tokens(ctx)
            token_lists = [fit_tokens(t, limit, False, f"input[{i}]", True) for i, t in enumerate(token_lists)]
        self.token_lists, self.results, self.n_next = list(token_lists), [], 0

    def run_piece(self, n_tokens: int, n_free_cells: int) -> int:
        end, used = self.n_next, 0
        while end < len(self.token_lists) and (end == self.n_next or used + len(self.token_lists[end]) <= n_tokens):
            used += len(self.token_lists[end])
            end += 1
        group = self.token_lists[self.n_next:end]
        if self.score:
            self.results.extend(score_token_lists(self.engine.ctx, group)[:, 0].tolist())
        else:
            self.results.extend(l2_normalize(v).tolist() for v in embed_token_lists(self.engine.ctx, group, self.kind))
        self.n_next = end
        if end == len(self.token_lists):
            self.future.set_result(np.asarray(self.results) if self.score else self.results)
        return used


def embedding_job(engine: Any, token_lists: Sequence[list[int]]) -> SideJob:
    """The side job that embeds ``token_lists`` (run it with ``engine.run_side``)."""
    if is_encoder(engine.ctx.model):
        return EncoderJob(engine, token_lists)
    return EmbeddingJob(engine, token_lists)


def embed_tokens(engine: Any, token_lists: Sequence[list[int]]) -> list[list[float]]:
    """All of ``token_lists`` at once, in the calling thread (the engine's, or while it is not running)."""
    job = embedding_job(engine, token_lists)
    while not job.done:
        job.run_piece(1 << 30, engine._free_cells())
    return job.future.result()
