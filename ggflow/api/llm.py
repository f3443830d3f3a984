"""``LLM``: a model, its context, and generation over them (the native ``generate``; llama-cpp-python's
``Llama`` methods come from the mixins of completions.py, chat.py, state.py and embeddings.py).

An ``LLM`` is an engine with one slot (ggflow.generation.engine), stepped in the caller's thread: the same
loop, sampler chain, stop strings, logprobs and context shift as ``ggflow serve``. The KV cache (sequence 0)
keeps the last prompt + completion: a call whose prompt shares a prefix with it evaluates only the rest.
Calls from several threads take turns (serialize.py). A full context ends a generation with finish_reason
"length" and ``context_full``; with ``context_shift=True`` it is shifted instead, as llama.cpp does: the
first ``n_keep`` tokens stay, half of the rest is dropped, and the keys after the gap are re-rotated to their
new positions (generation/context_shift.py).
"""
from __future__ import annotations

import collections
import os
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ggflow.api import arguments as A
from ggflow.api.chat import ChatMixin
from ggflow.api.completions import CompletionMixin
from ggflow.api.embeddings import EmbeddingMixin, check_pooling_type
from ggflow.api.encoder import ModelKindError, is_encoder
from ggflow.api.llama_cache import CacheMixin
from ggflow.api.model_path import default_model_path
from ggflow.api.rerank import RerankMixin
from ggflow.api.serialize import CallerLock
from ggflow.api.state import StateMixin
from ggflow.api.tokens import TokensMixin
from ggflow.core.batch import Batch
from ggflow.errors import ArgumentError, ContextFullError, GGFlowError
from ggflow.generation.records import Completion, Generation
from ggflow.generation.request import Done, Request

# llama-cpp-python Llama(...) options that change nothing here, accepted so a ported script runs as is
IGNORED_LLAMA_OPTIONS = frozenset({"verbose", "logits_all", "embedding", "n_batch", "n_gpu_layers", "use_mmap",
                                   "use_mlock", "n_threads_batch", "offload_kqv", "flash_attn", "last_n_tokens_size",
                                   "numa", "lora_base"})


class LLM(TokensMixin, CompletionMixin, ChatMixin, EmbeddingMixin, RerankMixin, StateMixin, CacheMixin):
    def __init__(self, model_path: str | None = None, *, backend: "str | Sequence[str]" = "auto",
                 n_ctx: int | None = 2048, n_threads: int | None = None, n_ubatch: int = 512,
                 seed: int | None = None, type_k: str = "F16", type_v: str = "F16", vocab_only: bool = False,
                 context_shift: bool = False, n_keep: int = 0, pooling_type: "str | int | None" = None,
                 draft_model: Any = None, lora_path: "str | os.PathLike | None" = None,
                 lora_scale: float = 1.0, **llama_cpp_options: Any):
        from ggflow.core.vocab import Vocab

        unknown = sorted(set(llama_cpp_options) - IGNORED_LLAMA_OPTIONS)
        if unknown:
            raise ArgumentError(unknown[0], llama_cpp_options[unknown[0]], "left out: LLM takes model_path, backend, "
                                "n_ctx, n_threads, n_ubatch, seed, type_k, type_v, vocab_only, context_shift, n_keep, "
                                "pooling_type, draft_model, lora_path, lora_scale")
        if model_path is not None and not isinstance(model_path, str) and not hasattr(model_path, "__fspath__"):
            raise ArgumentError("model_path", model_path, "a path to a GGUF file (or None for the default model)")
        n_ctx = A.check_n_ctx(n_ctx)
        n_ubatch = A.check_int("n_ubatch", n_ubatch, 1)
        self.seed = A.check_seed(seed)
        self.context_shift = A.check_bool("context_shift", context_shift)
        self.n_keep = A.check_int("n_keep", n_keep, -1)
        self.pooling_type = check_pooling_type(pooling_type)
        if n_threads is not None:
            A.check_int("n_threads", n_threads, 1)
        self.model_path = os.fspath(model_path) if model_path is not None else default_model_path()
        self.model = self.context = None
        self._lock = CallerLock()
        self._engine = None            # one slot over sequence 0 of the context
        self._template = None
        if vocab_only:  # the tokenizer alone, as llama.cpp's vocab_only: no weights, no KV cache
            self.vocab = Vocab.from_file(self.model_path)
            return
        from ggflow.api.memory_estimate import check_context_fits
        from ggflow.core.context import Context
        from ggflow.core.model import Model

        self.model = Model.load(self.model_path)
        self.vocab = self.model.vocab
        hp = self.model.hparams
        if self.context_shift and hp.n_rot == 0:
            raise ArgumentError("context_shift", True, "False for this model: its keys have no RoPE, so cached "
                                "keys cannot move to new positions")
        size = n_ctx or min(hp.n_ctx_train, 4096)
        check_context_fits(hp, size, n_ubatch, type_k, type_v,
                           cells=self.model.arch.kv_cells(hp, size, n_ubatch))
        self.context = Context(self.model, n_ctx=size, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                               backends=backend, n_threads=n_threads)
        if lora_path is not None:   # llama-cpp-python's one adapter (lora_base, for a quantized base, is not needed)
            from ggflow.core.lora import load_lora
            self.context.set_lora([load_lora(lora_path, self.model)], [A.check_number("lora_scale", lora_scale)])
        from ggflow.generation.engine import Engine
        self._engine = Engine(self.context, n_slots=1, max_queue=1, context_shift=self.context_shift,
                              n_keep=self.n_keep)
        if draft_model is not None:   # speculative decoding (ggflow.generation.speculative)
            from ggflow.generation.draft_model import drafter_for
            self._engine.drafter = drafter_for(draft_model, self.context, backends=backend, n_threads=n_threads)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files: list[str] | None = None,
                        local_dir: Any = None, local_dir_use_symlinks: Any = "auto", cache_dir: Any = None,
                        **kwargs: Any) -> "LLM":
        """A GGUF file of a Hugging Face Hub repository (llama-cpp-python's signature; ggflow/api/hub.py)."""
        from ggflow.api.hub import from_pretrained

        return from_pretrained(cls, repo_id, filename, additional_files, local_dir, local_dir_use_symlinks,
                               cache_dir, **kwargs)

    # -- the cache of sequence 0: the tokens whose K/V it holds, and how many a new prompt may reuse ----------
    @property
    def _cached(self) -> list[int]:
        return self._engine.slots[0].cache_tokens if self._engine is not None else []

    @_cached.setter
    def _cached(self, tokens: list[int]) -> None:
        self._engine.slots[0].cache_tokens = list(tokens)

    @property
    def _reusable(self) -> int:
        return self._engine.slots[0].n_reusable if self._engine is not None else 0

    @_reusable.setter
    def _reusable(self, n: int) -> None:
        self._engine.slots[0].n_reusable = n

    # -- sizes and special tokens (llama-cpp-python's names) ------------------------------------
    @property
    def n_ctx(self) -> "ContextSize":
        """The context size: ``llm.n_ctx()`` as llama-cpp-python calls it, and ``llm.n_ctx`` (ggflow's older
        property, which the CLI still reads) is the same number."""
        return ContextSize(self._require_context().n_ctx)

    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    def n_embd(self) -> int:
        if self.model is None:
            raise GGFlowError("this LLM was loaded with vocab_only=True: it has no weights")
        return self.model.hparams.n_embd

    def token_bos(self) -> int:
        return -1 if self.vocab.bos_id is None else int(self.vocab.bos_id)

    def token_eos(self) -> int:
        return -1 if self.vocab.eos_id is None else int(self.vocab.eos_id)

    def _require_context(self):
        if self.context is None:
            raise GGFlowError("this LLM was loaded with vocab_only=True: it can tokenize, not generate")
        return self.context

    def reset(self) -> None:
        """Forget the cached tokens: the next call evaluates its whole prompt."""
        with self._lock.turn():
            if self.context is not None:
                self.context.memory.seq_rm(0, 0, -1)
                self._cached, self._reusable = [], 0

    # -- evaluation --------------------------------------------------------------------------------
    def eval_prompt(self, tokens: Sequence[int]) -> tuple[np.ndarray, int]:
        """Bring the cache to exactly `tokens`; return the last token's logits and how many were reused."""
        tokens = A.check_token_ids(tokens, self.vocab.n_vocab, "tokens")
        with self._lock.turn():
            logits, reused = self._eval_prompt(tokens)
            return logits[-1], reused

    def _refuse_encoder(self) -> None:
        if is_encoder(self.model):
            raise ModelKindError(f"{self.model_path} is an encoder ({self.model.metadata.arch}): it embeds and "
                                 f"reranks (embed, create_embedding, rerank), it does not generate text")

    def _eval_prompt(self, tokens: list[int], all_logits: bool = False) -> tuple[np.ndarray, int]:
        """The logits of the last token ([1, n_vocab]) or of every token, and how many tokens were reused (the
        caller holds the turn)."""
        ctx = self._require_context()
        self._refuse_encoder()
        _check_fits(tokens, ctx.n_ctx)
        reuse = 0
        if not all_logits:  # cached tokens kept no logits: a call that wants them all evaluates them all
            for a, b in zip(self._cached[: self._reusable], tokens):
                if a != b:
                    break
                reuse += 1
            reuse = min(reuse, len(tokens) - 1)  # the last token is evaluated again to get its logits
        if not ctx.memory.seq_rm(0, reuse, -1):   # the memory cannot continue from there (a window cache)
            ctx.memory.seq_rm(0, 0, -1)
            reuse = 0
        self._cached, self._reusable = self._cached[:reuse], reuse
        if ctx.decode(Batch.from_tokens(tokens[reuse:], pos0=reuse, all_logits=all_logits)) != 0:
            raise ContextFullError("the KV cache is full")
        self._cached, self._reusable = list(tokens), len(tokens)
        return ctx.get_logits().copy(), reuse

    def _hidden_states(self, tokens: list[int]) -> np.ndarray:
        """The final hidden states [n_tokens, n_embd] of tokens evaluated alone from position 0 (the caller
        holds the turn). The cached tokens are dropped: the cache then holds these."""
        ctx = self._require_context()
        ctx.memory.seq_rm(0, 0, -1)
        self._cached, self._reusable = [], 0
        ctx.set_embeddings(True)
        try:
            if ctx.decode(Batch.from_tokens(tokens, all_logits=True)) != 0:
                raise ContextFullError("the KV cache is full")
            return ctx.get_embeddings().copy()
        finally:
            ctx.set_embeddings(False)
            ctx.memory.seq_rm(0, 0, -1)  # K/V of an embedding input are no prompt to continue

    # -- generation --------------------------------------------------------------------------------
    def generate(self, prompt: "str | Sequence[int]", max_tokens: int | None = 128, *,
                 stop: "str | Sequence[str] | None" = (), stream: bool = False, sampling: Any = None,
                 logits_processor: Any = None, add_special: bool = True, parse_special: bool = False,
                 logprobs: int | None = None, prompt_logprobs: bool = False,
                 stopping_criteria: Any = None, grammar: Any = None, json_schema: Any = None,
                 response_format: Any = None, **sampling_options: Any) -> "Completion | Generation":
        """Complete a prompt (text, or token ids). stream=True returns a Generation yielding text pieces.

        max_tokens None or <= 0: until the end of text (or a full context). ``logprobs=N`` records each
        generated token's log-probability and the N most likely alternatives (``Completion.logprobs``);
        ``prompt_logprobs`` does the same for the prompt's tokens. ``logits_processor`` and
        ``stopping_criteria`` take a callable or a list of them, as llama-cpp-python's do. ``grammar`` (GBNF, a
        ggflow.structured.Grammar or a LlamaGrammar), ``json_schema`` or ``response_format`` (OpenAI's)
        constrain the output (ggflow.structured; needs the grammar extra).
        """
        n_vocab = self.vocab.n_vocab
        prompt = A.check_prompt(prompt, n_vocab)
        max_tokens = A.check_max_tokens(max_tokens)
        stops = A.check_stop(stop)
        stream = A.check_bool("stream", stream)
        n_top = A.check_logprobs(logprobs, n_vocab)
        prompt_logprobs = A.check_bool("prompt_logprobs", prompt_logprobs)
        params = A.sampling_params(sampling_options, n_vocab, sampling)
        if params.seed is None and self.seed is not None:
            params = _replace(params, seed=self.seed)
        processors = _callables("logits_processor", logits_processor)
        criteria = _callables("stopping_criteria", stopping_criteria)
        self._require_context()
        spec = None
        if grammar is not None or json_schema is not None or response_format is not None:
            from ggflow.structured import grammar_from_request
            spec = grammar_from_request(grammar, json_schema, response_format)
        tokens = (self.vocab.tokenize(prompt, add_special=add_special, parse_special=parse_special)
                  if isinstance(prompt, str) else prompt)
        self._refuse_encoder()
        _check_fits(tokens, self.context.n_ctx)
        request = Request(tokens, lambda event: None, max_tokens=max_tokens, sampling=params, stop=stops,
                          grammar=spec, n_top=n_top, prompt_logprobs=prompt_logprobs, logits_processors=processors,
                          stopping_criteria=criteria)
        self._engine.prepare(request)   # the chain and grammar are built now: bad options fail before any work
        generation = Generation(lambda g: self._serialized(request, g))
        if stream:
            return generation
        for _ in generation:
            pass
        assert generation.result is not None
        return generation.result

    def generate_many(self, prompts: "Sequence[str | Sequence[int]]", max_tokens: int = 128, **options: Any
                      ) -> list[Completion]:
        """Complete many prompts, decoded together (ggflow.generation.batch.generate_many); results in order.
        The batch uses sequences 1.. of this LLM's cache and holds the turn while it runs."""
        from ggflow.generation.batch import generate_many

        with self._lock.turn():
            return generate_many(self, prompts, max_tokens, **options)

    def _serialized(self, request: Request, generation: Generation) -> Iterator[str]:
        """The engine's steps in the caller's thread, for one request: its pieces of text as they come."""
        events: collections.deque = collections.deque()
        request.on_event = events.append
        with self._lock.turn(generation):
            self._restore_prefix(request.prompt)   # set_cache: the longest cached prefix (llama_cache.py)
            self._engine.submit(request)
            done = False
            try:
                while not done:
                    self._engine.step()
                    while events:
                        event = events.popleft()
                        if isinstance(event, Done):
                            done = True
                            _finish(generation, event)
                            self._store_state()
                            break
                        if event.token >= 0:
                            generation.tokens.append(event.token)
                            if event.logprob is not None:
                                generation.logprobs.append(event.logprob)
                        if event.text:
                            yield event.text
            finally:
                if not done:   # closed early: the slot goes idle, keeping what it evaluated
                    request.cancel()
                    self._engine.step()


def _finish(generation: Generation, done: Done) -> None:
    if done.exception is not None:
        raise done.exception
    if done.error is not None:
        raise GGFlowError(done.error)
    generation.result = done.completion
    generation.tokens[:] = done.completion.tokens
    if done.completion.logprobs is not None:
        generation.logprobs[:] = done.completion.logprobs


def _check_fits(tokens: list[int], n_ctx: int) -> None:
    if not tokens:
        raise ArgumentError("prompt", tokens, "at least one token (an empty prompt has nothing to condition on)")
    if len(tokens) > n_ctx:
        raise ContextFullError(f"the prompt has {len(tokens)} tokens but the context holds {n_ctx}: "
                               f"shorten it or create the LLM with a larger n_ctx")


class ContextSize(int):
    """An int that may also be called for itself, so both ``llm.n_ctx`` and ``llm.n_ctx()`` give the size."""

    def __call__(self) -> int:
        return int(self)


def _replace(params: Any, **changes: Any) -> Any:
    import dataclasses
    return dataclasses.replace(params, **changes)


def _callables(name: str, value: Any) -> list[Callable]:
    """None, a callable, or a list of callables (llama-cpp-python's LogitsProcessorList is a list)."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for i, fn in enumerate(items):
        if not callable(fn):
            raise ArgumentError(name if len(items) == 1 and not isinstance(value, (list, tuple)) else f"{name}[{i}]",
                                fn, "a callable (input_ids, logits) -> ..., or a list of them")
    return items
