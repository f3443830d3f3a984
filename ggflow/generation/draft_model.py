"""A draft model: a smaller GGUF model with its own Context (and KV cache) drafting for the target.

Each sequence's draft cache follows the target lazily: before drafting, the tokens it holds are cut back to
their common prefix with the target's context (rejected drafts, a new prompt, a context shift) and the rest
is evaluated, all sequences in one batch. Then it drafts greedily, one batch per drafted position over all
drafting sequences, as llama.cpp's draft-simple does: the top token of each row, stopping a sequence when that
token's probability among the row's top 10 is below ``p_min`` or the draft reaches ``n_max``; a draft shorter
than ``n_min`` is dropped. Vocabularies are checked as llama.cpp's common_speculative_are_compatible checks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ggflow.core.batch import Batch
from ggflow.errors import ArgumentError, GGFlowError
from ggflow.generation.speculative import MAX_DRAFT, DraftRequest, Drafter, as_drafter, check_range

MAX_VOCAB_DIFFERENCE = 128     # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
FIRST_CHECKED_TOKEN = 5        # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
TOP_K = 10                     # the draft sampler's top_k (p_min is a probability among these)


class IncompatibleDraftError(GGFlowError, ValueError):
    """A draft model whose vocabulary is not the target's: its token ids would mean other text."""


def check_compatible(target: Any, draft: Any, target_name: str, draft_name: str) -> None:
    """Refuse a draft vocabulary the target cannot verify (common_speculative_are_compatible's checks)."""
    def refuse(what: str) -> None:
        raise IncompatibleDraftError(f"the draft model {draft_name} cannot draft for {target_name}: {what}")

    if target.model != draft.model:
        refuse(f"its vocabulary type is {draft.model!r}, the target's is {target.model!r}")
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos_id != draft.bos_id):
        refuse(f"BOS differs (add_bos {draft.add_bos}, id {draft.bos_id}; target: add_bos {target.add_bos}, "
               f"id {target.bos_id})")
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos_id != draft.eos_id):
        refuse(f"EOS differs (add_eos {draft.add_eos}, id {draft.eos_id}; target: add_eos {target.add_eos}, "
               f"id {target.eos_id})")
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_DIFFERENCE:
        refuse(f"it has {draft.n_vocab} tokens, the target {target.n_vocab} (at most {MAX_VOCAB_DIFFERENCE} apart)")
    for i in range(FIRST_CHECKED_TOKEN, min(target.n_vocab, draft.n_vocab)):
        if target.token_text(i) != draft.token_text(i):
            refuse(f"token {i} is {draft.token_text(i)!r} there and {target.token_text(i)!r} in the target")


class DraftModelDrafter(Drafter):
    def __init__(self, context: Any, n_vocab_target: int, n_max: int = 3, n_min: int = 0, p_min: float = 0.0):
        """``context``: the draft model's own Context (its KV cache holds the drafting sequences)."""
        self.ctx = context
        self.n_max = check_range("draft_max", n_max, 1, MAX_DRAFT)
        self.n_min = check_range("draft_min", n_min, 0, self.n_max)
        if isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or not 0.0 <= p_min <= 1.0:
            raise ArgumentError("draft_p_min", p_min, "a probability in [0, 1]")
        self.p_min = float(p_min)
        self.n_vocab = min(n_vocab_target, context.model.vocab.n_vocab)
        self.cached: dict[int, list[int]] = {}   # per sequence: the tokens the draft KV cache holds

    def draft(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        asked = list(requests)
        requests = [r for r in asked if len(r.tokens) < self.ctx.n_ctx]   # the draft context has room
        drafts: dict[int, list[int]] = {r.seq_id: [] for r in asked}
        if not requests or not self._catch_up(requests):
            return [[] for _ in asked]
        active = {r.seq_id: r for r in requests}
        rows = {r.seq_id: i for i, r in enumerate(requests)}   # output row of each sequence's last token
        while active:
            logits = self.ctx.get_logits()
            step = []
            for seq_id, r in list(active.items()):
                token, p = _top(logits[rows[seq_id]], self.n_vocab)
                if p < self.p_min:
                    del active[seq_id]
                    continue
                drafts[seq_id].append(token)
                if len(drafts[seq_id]) >= min(self.n_max, r.n_max):
                    del active[seq_id]
                    continue
                step.append((seq_id, token, len(r.tokens) + len(drafts[seq_id]) - 1))
            if not step or not self._decode(step):
                break
            rows = {seq_id: i for i, (seq_id, _, _) in enumerate(step)}
        return [d if len(d) >= self.n_min else [] for d in (drafts[r.seq_id] for r in asked)]

    def _catch_up(self, requests: Sequence[DraftRequest]) -> bool:
        """Bring each sequence's draft cache to its tokens, evaluating the last one for its logits."""
        tokens, pos, seqs, out = [], [], [], []
        for r in requests:
            held = self.cached.get(r.seq_id, [])
            keep = 0
            for a, b in zip(held, r.tokens):
                if a != b:
                    break
                keep += 1
            keep = min(keep, len(r.tokens) - 1)
            if not self.ctx.memory.seq_rm(r.seq_id, keep, -1):
                self.ctx.memory.seq_rm(r.seq_id, 0, -1)
                keep = 0
            self.cached[r.seq_id] = list(r.tokens[:keep])
            new = r.tokens[keep:]
            tokens += new
            pos += range(keep, len(r.tokens))
            seqs += [r.seq_id] * len(new)
            out += [False] * (len(new) - 1) + [True]
        batch = Batch(np.asarray(tokens, np.int32), np.asarray(pos), np.asarray(seqs), np.asarray(out))
        if self.ctx.decode(batch) != 0:   # no room: sequences not drafting now give theirs back, then once more
            asking = {r.seq_id for r in requests}
            for seq_id in [s for s in self.cached if s not in asking]:
                self.ctx.memory.seq_rm(seq_id, 0, -1)
                del self.cached[seq_id]
            if self.ctx.decode(batch) != 0:
                self._forget(requests)
                return False
        for r in requests:
            self.cached[r.seq_id] = list(r.tokens)
        return True

    def _decode(self, step: list[tuple[int, int, int]]) -> bool:
        batch = Batch(np.asarray([t for _, t, _ in step], np.int32), np.asarray([p for _, _, p in step]),
                      np.asarray([s for s, _, _ in step]), np.ones(len(step), bool))
        if self.ctx.decode(batch) != 0:
            return False
        for seq_id, token, _ in step:
            self.cached[seq_id].append(token)
        return True

    def _forget(self, requests: Sequence[DraftRequest]) -> None:
        for r in requests:
            self.ctx.memory.seq_rm(r.seq_id, 0, -1)
            self.cached[r.seq_id] = []


def _top(row: np.ndarray, n_vocab: int) -> tuple[int, float]:
    """The most likely token of a row (ids the target has) and its probability among the top TOP_K."""
    row = row[:n_vocab]
    top = np.argpartition(row, -TOP_K)[-TOP_K:] if n_vocab > TOP_K else np.arange(n_vocab)
    best = int(top[np.argmax(row[top])])
    e = np.exp(row[top].astype(np.float64) - row[best])
    return best, float(1.0 / e.sum())


def load_draft_model(path: "str | os.PathLike", target_context: Any, *, n_max: int = 3, n_min: int = 0,
                     p_min: float = 0.0, backends: Any = "auto", n_threads: int | None = None) -> DraftModelDrafter:
    """Load a GGUF draft model with a Context as large as the target's, after checking its vocabulary."""
    from ggflow.core.context import Context
    from ggflow.core.model import Model
    from ggflow.core.vocab import Vocab

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ArgumentError("draft_model", path, "a path to a GGUF file that exists")
    target = target_context.model
    check_compatible(target.vocab, Vocab.from_file(path), os.path.basename(target.path), os.path.basename(path))
    model = Model.load(path)
    ctx = Context(model, n_ctx=target_context.n_ctx, n_ubatch=target_context.n_ubatch, backends=backends,
                  n_threads=n_threads)
    return DraftModelDrafter(ctx, target.vocab.n_vocab, n_max, n_min, p_min)


@dataclass(frozen=True)
class DraftModel:
    """``LLM(draft_model=DraftModel("small.gguf", n_max=8))``: a draft model with its settings, loaded with the
    LLM (a bare path uses the defaults, llama.cpp's: 3, 0, 0.0)."""
    path: "str | os.PathLike"
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0


def drafter_for(draft_model: Any, target_context: Any, **load_options: Any) -> Drafter | None:
    """``LLM(draft_model=...)``: a GGUF path or a DraftModel, a prompt-lookup or other drafter, or None."""
    if isinstance(draft_model, (str, os.PathLike)):
        return load_draft_model(draft_model, target_context, **load_options)
    if isinstance(draft_model, DraftModel):
        return load_draft_model(draft_model.path, target_context, n_max=draft_model.n_max, n_min=draft_model.n_min,
                                p_min=draft_model.p_min, **load_options)
    return as_drafter(draft_model, target_context.model.vocab.n_vocab)
