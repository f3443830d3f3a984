"""Offline batches: many prompts through the engine in the calling thread, completions in prompt order.

    completions = generate_many(llm, ["Once upon a time", "The capital of France is"], max_tokens=32)

With an ``LLM`` the engine shares its Context: the slots use sequence ids 1.. and leave sequence 0 (the
LLM's own prompt cache) as it was; they are removed from the cache when the batch is done.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ggflow.generation.records import Completion
from ggflow.core.sampling import SamplingParams
from ggflow.errors import GGFlowError
from ggflow.generation.engine import Engine
from ggflow.generation.request import Done, Request


def generate_many(llm_or_model: Any, prompts: Sequence["str | Sequence[int]"], max_tokens: int = 128, *,
                  n_slots: int = 4, stop: Sequence[str] = (), sampling: SamplingParams | None = None,
                  n_ctx: int = 2048, n_threads: int | None = None, timeout: float | None = None,
                  **sampling_options: Any) -> list[Completion]:
    """Complete every prompt (text or token ids), n_slots at a time in one decode per step.

    ``llm_or_model``: an ``LLM``, a loaded ``Model`` or a GGUF path (n_ctx, n_threads apply to the last two).
    Each prompt gets the sampling options as it would alone: greedy results equal ``LLM.generate``'s.
    """
    if sampling is None:
        try:
            sampling = SamplingParams(**sampling_options)
        except TypeError as exc:
            raise GGFlowError(f"unknown sampling option: {exc}") from None
    elif sampling_options:
        raise GGFlowError("pass sampling options either as a SamplingParams or as keywords, not both")
    engine = _engine_for(llm_or_model, min(n_slots, max(len(prompts), 1)), n_ctx, n_threads, len(prompts))
    seed = getattr(llm_or_model, "seed", None)
    if sampling.seed is None and seed is not None:
        sampling = dataclasses.replace(sampling, seed=seed)
    results: list[Done | None] = [None] * len(prompts)
    try:
        for i, prompt in enumerate(prompts):
            tokens = engine.vocab.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            engine.submit(Request(tokens, lambda ev, i=i: _keep(results, i, ev), max_tokens=max_tokens,
                                  sampling=sampling, stop=list(stop)))
        engine.run_until_idle(timeout)
    finally:
        engine.clear_cache()
    for done in results:
        if done is None or done.error is not None:
            raise GGFlowError(f"a prompt of the batch failed: {done.error if done else 'no result'}")
    return [done.completion for done in results]  # type: ignore[union-attr]


def _keep(results: list, i: int, event: Any) -> None:
    if isinstance(event, Done):
        results[i] = event


def _engine_for(source: Any, n_slots: int, n_ctx: int, n_threads: int | None, n_prompts: int) -> Engine:
    if hasattr(source, "context"):   # an LLM: share its Context, keep off its sequence 0
        if source.context is None:
            raise GGFlowError("this LLM was loaded with vocab_only=True: it can tokenize, not generate")
        return Engine(source.context, n_slots=n_slots, max_queue=n_prompts, first_seq_id=1)
    from ggflow.core.context import Context
    from ggflow.core.model import Model

    model = source if isinstance(source, Model) else Model.load(source)
    return Engine(Context(model, n_ctx=n_ctx, n_threads=n_threads), n_slots=n_slots, max_queue=n_prompts)
