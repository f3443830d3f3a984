"""Request bodies of the OpenAI routes (with llama-server's extra sampling fields) and their mapping to
``SamplingParams``. The models are strict: a field of the wrong type is a 400, not a silent coercion."""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Iterable, Union

from pydantic import BaseModel, ConfigDict, Field

from ggflow.core.sampling import SamplingParams
from ggflow.core.sampling_stages import sampler_stages
from ggflow.api import arguments as A
from ggflow.errors import ArgumentError, GGFlowError
from ggflow.serving.lora import LoraEntry

if TYPE_CHECKING:
    from ggflow.structured import Grammar

_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "min_keep", "dynatemp_range",
                    "dynatemp_exponent", "repeat_penalty", "repeat_last_n", "frequency_penalty",
                    "presence_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                    "xtc_probability", "xtc_threshold", "top_n_sigma", "mirostat", "mirostat_tau",
                    "mirostat_eta", "seed")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class GenerationBody(_Strict):
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None   # OpenAI's newer name (chat)
    n_predict: int | None = None               # llama-server's name
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    logit_bias: dict[str, float] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    min_keep: int | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    top_n_sigma: float | None = None
    lora: list[LoraEntry] | None = None        # llama-server's per-request adapter mix (serving/lora.py)
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    seed: int | None = None
    ignore_eos: bool = False                   # llama-server's: end-of-generation tokens get a -inf bias
    grammar: str | None = None                 # llama-server's: GBNF
    json_schema: dict[str, Any] | None = None  # llama-server's
    response_format: dict[str, Any] | None = None   # OpenAI's: text, json_object, json_schema
    samplers: Union[str, list[Union[str, dict[str, Any]]], None] = None   # stages, with parameters

    def sampling(self, eog_tokens: Iterable[int] = (), n_vocab: int = 2**31 - 1) -> SamplingParams:
        """The request's sampling options; llama.cpp's defaults for the fields it leaves out."""
        if self.n < 1:
            raise GGFlowError(f"n must be at least 1, got {self.n}")
        if self.n > 1 and self.stream:
            raise GGFlowError(f"n={self.n} choices are answered whole: ask with stream false (or n 1)")
        given: dict[str, Any] = {f: getattr(self, f) for f in _SAMPLING_FIELDS if getattr(self, f) is not None}
        if given.get("seed") in (-1, 0xFFFFFFFF):
            given["seed"] = None
        if self.logit_bias:
            given["logit_bias"] = self.logit_bias
        # the ranges LLM checks (ggflow/api/arguments.py's one table): top_p 2, "+5" as a token id -> 400
        params = A.sampling_params(given, n_vocab)
        changes: dict[str, Any] = {}
        if self.samplers is not None:   # checked against each sampler's declared parameters (a 400 if not)
            changes["samplers"] = sampler_stages(self.samplers)
        if self.ignore_eos:
            changes["logit_bias"] = {**params.logit_bias, **{t: -math.inf for t in eog_tokens}}
        return dataclasses.replace(params, **changes) if changes else params

    def constraint(self) -> "Grammar | None":
        """The grammar the request asks for (grammar, json_schema or response_format), checked later against
        the vocabulary; an invalid one is a GrammarError (400)."""
        from ggflow.structured import grammar_from_request
        return grammar_from_request(self.grammar, self.json_schema, self.response_format)

    def stops(self) -> list[str]:
        return A.check_stop(self.stop)   # as LLM reads it: "" is no stop string

    def token_limit(self, default: int, until_end: int | None = None) -> int:
        """The request's max_tokens (max_completion_tokens, n_predict): ``default`` when it gives none; -1:
        until the end of text or the context (``until_end``, the context size); below -1: refused."""
        for name in ("max_completion_tokens", "max_tokens", "n_predict"):
            value = getattr(self, name)
            if value is not None:
                _check_limit(name, value)
                return (default if until_end is None else until_end) if value == -1 else value
        return default

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionBody(GenerationBody):
    prompt: Union[str, list[int], list[str]]
    echo: bool = False
    logprobs: int | None = None                # OpenAI's legacy: each token's, and this many alternatives

    def top_logprobs_count(self, n_vocab: int) -> int | None:
        return _logprobs_count("logprobs", self.logprobs, n_vocab)


class ChatCompletionBody(GenerationBody):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool = True
    logprobs: bool | None = None
    top_logprobs: int | None = None
    reasoning_format: str | None = None        # llama-server's: none / auto / deepseek (serving/reasoning.py)
    reasoning_budget: int | None = None        # -1 unlimited, 0 no thinking
    chat_template_kwargs: dict[str, Any] | None = None

    def top_logprobs_count(self, n_vocab: int) -> int | None:
        """OpenAI's pair: logprobs true asks for them, top_logprobs for that many alternatives too."""
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise GGFlowError("top_logprobs needs logprobs: true")
            return None
        return _logprobs_count("top_logprobs", self.top_logprobs or 0, n_vocab)


def _check_limit(name: str, value: int) -> None:
    """max_completion_tokens and n_predict take max_tokens' range, under their own names."""
    try:
        A.check_range("max_tokens", value)
    except ArgumentError as exc:
        raise ArgumentError(name, value, exc.accepted) from None


def _logprobs_count(name: str, value: int | None, n_vocab: int) -> int | None:
    if value is not None and not 0 <= value <= n_vocab:
        raise GGFlowError(f"{name} must be in [0, {n_vocab}], got {value}")
    return value


class TokenizeBody(_Strict):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class EmbeddingBody(_Strict):
    input: Union[str, list[str], list[int], list[list[int]]]
    model: str | None = None
    encoding_format: str = "float"

    def token_lists(self, vocab: Any, n_ctx: int) -> list[list[int]]:
        """Each input as token ids (text is tokenized with BOS), checked against the vocabulary and context."""
        if self.encoding_format not in ("float", "base64"):
            raise GGFlowError(f"encoding_format must be float or base64, got {self.encoding_format!r}")
        raw = self.input
        if isinstance(raw, str):
            items: list = [raw]
        elif raw and all(isinstance(t, int) for t in raw):
            items = [raw]            # one input given as token ids
        else:
            items = list(raw)
        if not items:
            raise GGFlowError("input is empty: give a string, a list of strings, or token ids")
        lists = []
        for i, item in enumerate(items):
            tokens = vocab.tokenize(item) if isinstance(item, str) else list(item)
            if not tokens:
                raise GGFlowError(f"input[{i}] has no tokens")
            if len(tokens) > n_ctx:
                raise GGFlowError(f"input[{i}] has {len(tokens)} tokens but the context holds {n_ctx}")
            bad = [t for t in tokens if not 0 <= t < vocab.n_vocab]
            if bad:
                raise GGFlowError(f"token id {bad[0]} in input[{i}] is outside the vocabulary [0, {vocab.n_vocab})")
            lists.append(tokens)
        return lists


class DetokenizeBody(_Strict):
    tokens: list[int]
