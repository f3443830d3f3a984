"""``compute_imatrix``: run a model over a text in chunks and collect llama-imatrix's statistics.

As llama-imatrix's compute_imatrix: the whole text is tokenized once (with BOS if the model adds one);
``from_chunk`` chunks of ``n_ctx`` tokens are skipped; at least two chunks must remain; each chunk runs
from an empty KV cache with its first token replaced by BOS (where the model adds one) and every token's
output requested (so the last layer runs on all of them). The collector (collector.py) sees each product
through the scheduler's observer hook. llama-imatrix batches up to 2048 / n_ctx chunks at once; here a
chunk is one batch, evaluated in ubatches of ``n_ubatch`` tokens (same rows, same order for n_ctx <= 512).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_OK, Context
from ggflow.core.model import Model
from ggflow.errors import GGFlowError
from ggflow.imatrix.collector import Collector
from ggflow.imatrix.files import Imatrix, chunk_count


def compute_imatrix(model: "str | os.PathLike | Model", text: str, *, n_ctx: int = 512, from_chunk: int = 0,
                    n_chunks: int = -1, process_output: bool = False, dataset: str = "", n_ubatch: int = 512,
                    backends: str = "auto", n_threads: int | None = None, type_k: str = "F16", type_v: str = "F16",
                    progress: bool = False) -> Imatrix:
    """The importance matrix of `model` over `text` (llama-imatrix -m MODEL -f TEXT -c n_ctx --chunk
    from_chunk --chunks n_chunks [--process-output]); the KV cache in F16 as llama.cpp's default. Raises GGFlowError for too short a text."""
    if n_ctx < 1:
        raise GGFlowError("imatrix needs a context size (-c) of at least 1 token")
    model = model if isinstance(model, Model) else Model.load(model)
    vocab = model.vocab
    tokens = np.asarray(vocab.tokenize(text, add_special=True), np.int32)
    if from_chunk > 0:
        if (from_chunk + 2) * n_ctx >= len(tokens):
            raise GGFlowError(f"there will be not enough tokens left after removing {from_chunk} chunks "
                              f"({len(tokens)} tokens, chunks of {n_ctx})")
        tokens = tokens[from_chunk * n_ctx:]
    if len(tokens) < 2 * n_ctx:
        raise GGFlowError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; the text "
                          f"tokenizes to only {len(tokens)} tokens (llama-imatrix asks the same)")
    n_max = len(tokens) // n_ctx
    n = n_max if n_chunks < 0 else min(n_chunks, n_max)
    ctx = Context(model, n_ctx=n_ctx, n_ubatch=min(n_ubatch, n_ctx), backends=backends, n_threads=n_threads,
                  type_k=type_k, type_v=type_v)
    collector = Collector(frozenset(model.weights), process_output)
    ctx.scheduler.observer = collector
    bos = vocab.bos_id if vocab.add_bos and vocab.bos_id is not None else None
    start = time.perf_counter()
    for i in range(n):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
        if bos is not None:
            chunk[0] = bos
        ctx.clear()
        if ctx.decode(Batch.from_tokens(chunk.tolist(), all_logits=True)) != DECODE_OK:
            raise GGFlowError(f"chunk {i}: the batch did not fit the context")
        if progress:
            print(f"[{i + 1}/{n}] {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return Imatrix(collector.entries, [dataset] if dataset else [], chunk_count(collector.entries, n_ctx), n_ctx)
