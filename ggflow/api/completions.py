"""llama-cpp-python's text completion on LLM: ``llm(prompt)`` / ``create_completion``, the same arguments,
defaults and returned dicts (``echo``, ``logprobs=N``, ``stop`` as a string or list, ``max_tokens`` None or
<= 0 for no limit, ``stream`` of chunks)."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ggflow.api import arguments as A
from ggflow.api import shapes
from ggflow.generation.logprobs import completion_logprobs, echoed_entries, generated_entries, without_eog
from ggflow.errors import ArgumentError, ContextFullError


def llama_sampling(temperature: float, top_p: float, min_p: float, typical_p: float, frequency_penalty: float,
                   presence_penalty: float, repeat_penalty: float, top_k: int, seed: Any, tfs_z: float,
                   mirostat_mode: int, mirostat_tau: float, mirostat_eta: float, logit_bias: Any,
                   grammar: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """llama-cpp-python's sampling arguments as generate's keywords (extra: any other SamplingParams field).
    ``extra["sampling"]``, a whole SamplingParams (ggflow's way), replaces the sampling ones."""
    if "sampling" in extra:
        return {**extra, "grammar": grammar}
    if tfs_z != 1.0:
        raise ArgumentError("tfs_z", tfs_z, "1.0: tail-free sampling was removed from llama.cpp, and ggflow has none")
    return {"grammar": grammar,"temperature": temperature, "top_p": top_p, "min_p": min_p, "typical_p": typical_p,
            "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
            "repeat_penalty": repeat_penalty, "top_k": top_k, "seed": seed, "mirostat": mirostat_mode,
            "mirostat_tau": mirostat_tau, "mirostat_eta": mirostat_eta, "logit_bias": logit_bias, **extra}


def array_callables(value: Any) -> Any:
    """llama-cpp-python's processors and criteria take the ids as a numpy int array."""
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return [(lambda f: (lambda ids, scores: f(np.asarray(ids, dtype=np.intc), scores)))(f) if callable(f) else f
            for f in items]


class CompletionMixin:
    def __call__(self, prompt: "str | list[int]", *args: Any, **kwargs: Any) -> Any:
        """``llm(prompt, ...)`` is ``create_completion(prompt, ...)``."""
        return self.create_completion(prompt, *args, **kwargs)

    def create_completion(self, prompt: "str | list[int]", suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: "str | list[str] | None" = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: str | None = None, stopping_criteria: Any = None, logits_processor: Any = None,
                          grammar: Any = None, logit_bias: dict[int, float] | None = None,
                          **sampling_options: Any) -> "dict[str, Any] | Iterator[dict[str, Any]]":
        """A text completion dict ("object": "text_completion"), or with stream=True an iterator of its chunks."""
        n_vocab = self.vocab.n_vocab
        prompt = A.check_prompt(prompt, n_vocab)
        if suffix is not None:
            raise ArgumentError("suffix", suffix, "None: fill-in-the-middle (suffix) is not implemented")
        echo = A.check_bool("echo", echo)
        stream = A.check_bool("stream", stream)
        n_top = A.check_logprobs(logprobs, n_vocab)
        max_tokens = A.check_max_tokens(max_tokens)
        options = llama_sampling(temperature, top_p, min_p, typical_p, frequency_penalty, presence_penalty,
                                 repeat_penalty, top_k, seed, tfs_z, mirostat_mode, mirostat_tau, mirostat_eta,
                                 logit_bias, grammar, sampling_options)
        # as llama-cpp-python: BOS (if the model wants one), then the text with special tokens parsed
        tokens = self.tokenize(prompt, add_bos=True, special=True) if isinstance(prompt, str) else prompt
        n_ctx = self.n_ctx()
        if len(tokens) >= n_ctx:  # no room for a generated token
            raise ContextFullError(f"Requested tokens ({len(tokens)}) exceed context window of {n_ctx}")
        room = n_ctx - len(tokens)  # as llama-cpp-python: no more than the context holds (unless it shifts)
        if max_tokens is None or not self.context_shift:
            max_tokens = room if max_tokens is None else min(max_tokens, room)
        gen = self.generate(tokens, max_tokens, stop=stop, stream=True, logprobs=n_top,
                            prompt_logprobs=echo and n_top is not None,
                            logits_processor=array_callables(logits_processor),
                            stopping_criteria=array_callables(stopping_criteria), **options)
        prompt_text = prompt if isinstance(prompt, str) else self.detokenize(tokens).text
        call = _CompletionCall(shapes.completion_id(), shapes.now(), model or self.model_path, prompt_text, echo,
                               n_top is not None)
        if stream:
            return self._completion_chunks(gen, call)
        for _ in gen:
            pass
        return self._completion_dict(gen.result, call)

    def _completion_dict(self, result: Any, call: "_CompletionCall") -> dict[str, Any]:
        text = call.prompt + result.text if call.echo else result.text
        lp = None
        if result.logprobs is not None:
            entries = echoed_entries(self.vocab, result) if call.echo else generated_entries(self.vocab, result)
            lp = completion_logprobs(self.vocab, entries, 0 if call.echo else len(call.prompt))
        return shapes.text_completion(call.ident, call.created, call.model, text, lp, result.finish_reason,
                                      len(result.prompt_tokens), len(without_eog(self.vocab, result.tokens)))

    def _completion_chunks(self, gen: Any, call: "_CompletionCall") -> Iterator[dict[str, Any]]:
        offset, seen = len(call.prompt), 0
        if call.echo:
            yield shapes.completion_chunk(call.ident, call.created, call.model, call.prompt, None, None)
        for piece in gen:
            lp = None
            if call.logprobs:
                new = [e for e in gen.logprobs[seen:] if not self.vocab.is_eog(e.token)]
                seen = len(gen.logprobs)
                lp = completion_logprobs(self.vocab, new, offset)
            offset += len(piece)
            yield shapes.completion_chunk(call.ident, call.created, call.model, piece, lp, None)
        yield shapes.completion_chunk(call.ident, call.created, call.model, "", None, gen.result.finish_reason)


class _CompletionCall:
    def __init__(self, ident: str, created: int, model: str, prompt: str, echo: bool, logprobs: bool):
        self.ident, self.created, self.model, self.prompt, self.echo = ident, created, model, prompt, echo
        self.logprobs = logprobs
