"""``POST /v1/embeddings``: inputs evaluated in the engine thread, between decode steps, on a spare sequence.

The engine is the only code that touches the Context, so an embedding request is a call the engine runs
before its next step (``Engine.call_soon``): it switches the Context to embeddings output, evaluates each
input from position 0 on a sequence id no slot uses, reads the final hidden states, and removes that
sequence again, so the slots' caches are untouched. As llama-server's OpenAI route, a causal model's
per-token states are mean-pooled (a model's own ``pooling_type`` wins) and the vectors are L2-normalized.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggflow.api.embeddings import l2_normalize, model_pooling_type, pool
from ggflow.api.encoder import embed_token_lists, fit_tokens, is_encoder, max_input_tokens
from ggflow.core.batch import Batch
from ggflow.core.memory import MAX_SEQ
from ggflow.errors import GGFlowError
from ggflow.serving.request import QueueFullError


def spare_sequence(engine: Any) -> int:
    """A sequence id of the cache that no slot uses."""
    used = {slot.seq_id for slot in engine.slots}
    n_seq_max = int(getattr(engine.ctx.memory, "n_seq_max", MAX_SEQ))
    free = [s for s in range(n_seq_max) if s not in used]
    if not free:
        raise GGFlowError("every sequence of the KV cache is a slot: start the server with fewer slots (-np) "
                          "to serve embeddings")
    return free[0]


def embed_tokens(engine: Any, token_lists: Sequence[list[int]]) -> list[list[float]]:
    """Run in the engine thread: one pooled, normalized vector per token list."""
    ctx = engine.ctx
    kind = model_pooling_type(ctx.model.metadata)
    kind = "mean" if kind == "none" else kind       # one vector per input, as OpenAI's route returns
    if is_encoder(ctx.model):   # no cache to spare a sequence of: every input at once, batched per ubatch
        limit = max_input_tokens(ctx)
        token_lists = [fit_tokens(t, limit, False, f"input[{i}]", True) for i, t in enumerate(token_lists)]
        return [l2_normalize(v).tolist() for v in embed_token_lists(ctx, token_lists, kind)]
    seq = spare_sequence(engine)
    if getattr(ctx, "lora", None) is not None:   # the LoRA adapters' default mix (POST /lora-adapters)
        ctx.lora.set_sequence(seq, ctx.lora.scales)
    vectors = []
    ctx.set_embeddings(True)
    try:
        for tokens in token_lists:
            try:
                if ctx.decode(Batch.from_tokens(tokens, seq_id=seq, all_logits=True)) != 0:
                    raise QueueFullError("the KV cache has no room for this input now: retry later")
                vectors.append(l2_normalize(pool(np.asarray(ctx.get_embeddings()), kind)).tolist())
            finally:
                ctx.memory.seq_rm(seq, 0, -1)
    finally:
        ctx.set_embeddings(False)
    return vectors
