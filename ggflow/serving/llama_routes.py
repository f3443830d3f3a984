"""llama-server's own routes, in its native shapes: /completion, /infill, /apply-template, POST /props, and
/tokenize's ``with_pieces``. Field names and meanings follow tools/server of llama.cpp (server-task.cpp's
to_json_non_oaicompat, server-common.cpp's tokenize_input_prompts and format_prompt_infill)."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Union

from fastapi import Request as HTTPRequest
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ggflow.core.sampling import SamplingParams
from ggflow.errors import GGFlowError
from ggflow.generation.records import Completion
from ggflow.generation.request import Piece
from ggflow.serving.native_run import ClientGone, GenerationFailed, complete, make_request, pieces, stop_type
from ggflow.serving.openai_params import GenerationBody, _Strict
from ggflow.serving.responses import error_response

NATIVE_DEFAULT_MAX_TOKENS = None   # llama-server's n_predict -1: until the end of text or a full context
FIM_REPO_NAME = "myproject\n"      # llama-server's fixed repository name of the repo-level FIM pattern
FIM_CURRENT_FILE = "filename\n"    # and its fixed name of the current file
FIM_CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"   # between extra chunks when the vocabulary has no FIM_SEP

PromptPart = Union[str, int, list, dict]


class NativeCompletionBody(GenerationBody):
    """/completion's body: OpenAI's generation fields plus llama-server's own."""
    prompt: Any = None
    n_probs: int = 0
    post_sampling_probs: bool = False
    cache_prompt: bool = True            # ggflow always reuses a cached prefix: it never changes the result
    return_tokens: bool = False
    response_fields: list[str] | None = None
    id_slot: int = -1
    multimodal_data: list[str] | None = None
    logit_bias: Any = None               # llama-server's forms too: [[token or text, bias]], {"text": bias}


def native_logit_bias(vocab: Any, raw: Any) -> dict[str, float] | None:
    """llama-server's logit_bias as token id -> bias: an object or a list of [key, bias] pairs; a key is a
    token id (an integer, or an integer string) or a text whose every token gets the bias; a bias of false
    bans the token."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 for p in raw):
        pairs = [tuple(p) for p in raw]
    else:
        raise GGFlowError("logit_bias must be an object or a list of [token or text, bias] pairs")
    out: dict[str, float] = {}
    for key, bias in pairs:
        if bias is False:
            value = -math.inf
        elif isinstance(bias, (int, float)) and not isinstance(bias, bool) and math.isfinite(bias):
            value = float(bias)
        else:
            raise GGFlowError(f"logit_bias for {str(key)[:40]!r} must be a finite number or false")
        if isinstance(key, int) and not isinstance(key, bool):
            ids = [key]
        elif isinstance(key, str) and key.lstrip("-").isdigit():
            ids = [int(key)]
        elif isinstance(key, str):
            ids = vocab.tokenize(key, add_special=False, parse_special=False)
        else:
            raise GGFlowError("logit_bias keys must be token ids or texts")
        bad = [t for t in ids if not 0 <= t < vocab.n_vocab]
        if bad:
            raise GGFlowError(f"logit_bias token id {bad[0]} is outside the vocabulary [0, {vocab.n_vocab})")
        out.update({str(t): value for t in ids})
    return out


class PropsBody(BaseModel):
    model_config = ConfigDict(extra="allow")   # every key given is a property the request would change


class SlotFileBody(_Strict):
    filename: Any = None                       # checked by slot_files.checked_path, with its own message


class InfillExtra(_Strict):
    text: str
    filename: str = "tmp"


class InfillBody(NativeCompletionBody):
    input_prefix: Union[str, list[Union[str, int]]]
    input_suffix: Union[str, list[Union[str, int]]]
    input_extra: list[InfillExtra] = Field(default_factory=list)
    prompt: str = ""


class ApplyTemplateBody(_Strict):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


def _tokenize_mixed(vocab: Any, parts: Any, add_special: bool) -> list[int]:
    """A string, or a list of strings and token ids (llama-server's tokenize_mixed): only the first string
    gets the vocabulary's BOS."""
    if isinstance(parts, str):
        return vocab.tokenize(parts, add_special=add_special, parse_special=True)
    out: list[int] = []
    for i, p in enumerate(parts):
        if isinstance(p, bool) or not isinstance(p, (int, str)):
            raise GGFlowError(f"a prompt list holds strings and token ids; item {i} is {type(p).__name__}")
        out += [p] if isinstance(p, int) else vocab.tokenize(p, add_special=add_special and i == 0,
                                                             parse_special=True)
    return out


def prompt_token_lists(vocab: Any, prompt: Any) -> tuple[list[list[int]], bool]:
    """llama-server's prompt forms as token lists, and whether the request is a batch (answered with a list).

    A string; token ids; ids and strings mixed (one prompt); {"prompt_string": ...}; or a list of those (a
    batch). Multimodal data is refused: ggflow has no vision models."""
    def one(p: Any, where: str) -> list[int]:
        if isinstance(p, str) or (isinstance(p, list) and any(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in p)):
            return _tokenize_mixed(vocab, p, True)
        if isinstance(p, dict):
            if p.get("multimodal_data"):
                raise GGFlowError(f"{where}: multimodal_data needs a vision model; this server has none")
            text = p.get("prompt_string")
            if not isinstance(text, str):
                raise GGFlowError(f"{where}: an object prompt needs a string prompt_string")
            return _tokenize_mixed(vocab, text, True)
        raise GGFlowError(f"{where} must be a string, token ids, or {{\"prompt_string\": ...}}; "
                          f"got {type(p).__name__}")

    if prompt is None:
        raise GGFlowError("prompt is required")
    if isinstance(prompt, list) and prompt and not any(isinstance(x, int) and not isinstance(x, bool)
                                                       for x in prompt):
        return [one(p, f"prompt[{i}]") for i, p in enumerate(prompt)], True
    return [one(prompt, "prompt")], False


def probs_json(vocab: Any, entries: list, post_sampling: bool) -> list[dict[str, Any]]:
    """completion_probabilities: per token id, text, bytes, logprob (or prob) and the top alternatives.

    ggflow's probabilities are the model's (softmax of the raw logits); ``post_sampling_probs`` reports
    them as probabilities ("prob"/"top_probs"), not after the sampler chain's truncation."""
    def tok(t: int, lp: float) -> dict[str, Any]:
        raw = vocab.token_to_piece(t, special=True)
        text = raw.decode("utf-8", errors="ignore")
        value = math.exp(lp) if post_sampling else (lp if math.isfinite(lp) else -3.4028234663852886e38)
        return {"id": t, "token": text, "bytes": list(raw), "prob" if post_sampling else "logprob": value}

    out = []
    for e in entries:
        entry = tok(e.token, e.logprob if e.logprob is not None else 0.0)
        top = [tok(t, lp) for t, lp in e.top]
        if post_sampling:
            top = [x for x in top if x["prob"] > 0.0]
        entry["top_probs" if post_sampling else "top_logprobs"] = top
        out.append(entry)
    return out


def timings_json(c: Completion) -> dict[str, float]:
    t = c.timings
    return {"cache_n": t.cached_n, "prompt_n": t.prompt_n, "prompt_ms": t.prompt_ms,
            "prompt_per_token_ms": t.prompt_ms / t.prompt_n if t.prompt_n else 0.0,
            "prompt_per_second": t.prompt_per_second, "predicted_n": t.predicted_n, "predicted_ms": t.predicted_ms,
            "predicted_per_token_ms": t.predicted_ms / t.predicted_n if t.predicted_n else 0.0,
            "predicted_per_second": t.predicted_per_second}


def generation_settings(body: NativeCompletionBody, sampling: SamplingParams, n_predict: int | None) -> dict:
    settings = {k: v for k, v in dataclasses.asdict(sampling).items() if isinstance(v, (int, float, str, bool))}
    settings.update(n_predict=-1 if n_predict is None else n_predict, stop=body.stops(), n_probs=body.n_probs,
                    stream=body.stream, cache_prompt=body.cache_prompt, post_sampling_probs=body.post_sampling_probs,
                    seed=0xFFFFFFFF if sampling.seed is None else sampling.seed,
                    logit_bias=[{"token": int(t), "bias": b if math.isfinite(b) else None}   # null: -inf
                                for t, b in (sampling.logit_bias or {}).items()])
    return settings


def nested_fields(fields: list[str], value: dict[str, Any]) -> dict[str, Any]:
    """llama-server's response_fields: "a/b" picks value["a"]["b"], reported under the key "a/b"."""
    out = {}
    for path in fields:
        node: Any = value
        for key in path.split("/"):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            out[path] = node
    return out


class NativeShape:
    """The JSON of a /completion answer, final or streamed, for one prompt."""

    def __init__(self, vocab: Any, model: str, body: NativeCompletionBody, tokens: list[int], index: int):
        self.vocab, self.model, self.body, self.tokens, self.index = vocab, model, body, tokens, index
        self.sampling = body.sampling(vocab.special.eog)

    def final(self, c: Completion, streamed: bool) -> dict[str, Any]:
        kind, word = stop_type(self.vocab, c, self.body.stops())
        n_predict = self.body.token_limit(-1)
        tokens = list(c.tokens) if self.body.return_tokens and not streamed else []
        res = {"index": self.index, "content": "" if streamed else c.text, "tokens": tokens, "id_slot": self.body.id_slot,
               "stop": True, "model": self.model, "tokens_predicted": len(c.tokens),
               "tokens_evaluated": len(c.prompt_tokens),
               "generation_settings": generation_settings(self.body, self.sampling, n_predict),
               "prompt": self.vocab.detokenize(self.tokens, unparse_special=True), "has_new_line": "\n" in c.text,
               "truncated": c.context_full, "stop_type": kind, "stopping_word": word,
               "tokens_cached": len(c.prompt_tokens) + len(c.tokens), "timings": timings_json(c)}
        if not streamed and self.body.n_probs > 0 and c.logprobs:
            res["completion_probabilities"] = probs_json(self.vocab, c.logprobs, self.body.post_sampling_probs)
        return nested_fields(self.body.response_fields, res) if self.body.response_fields else res

    def partial(self, p: Piece, n_decoded: int) -> dict[str, Any]:
        res = {"index": self.index, "content": p.text, "tokens": [p.token],   # a partial always has its token
               "stop": False, "id_slot": self.body.id_slot, "tokens_predicted": n_decoded,
               "tokens_evaluated": len(self.tokens)}
        if self.body.n_probs > 0 and p.logprob is not None:
            res["completion_probabilities"] = probs_json(self.vocab, [p.logprob], self.body.post_sampling_probs)
        return res


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _check_body(body: NativeCompletionBody, n_vocab: int) -> int | None:
    if not 0 <= body.n_probs <= n_vocab:
        raise GGFlowError(f"n_probs must be in [0, {n_vocab}], got {body.n_probs}")
    if body.multimodal_data:
        raise GGFlowError("multimodal_data needs a vision model; this server has none")
    return body.n_probs or None


async def run_native(http: HTTPRequest, engine: Any, model: str, body: NativeCompletionBody,
                     token_lists: list[list[int]], batch: bool, grammar: Any = None) -> Any:
    """Answer /completion or /infill: one JSON object, a list (a batch of prompts), or a stream."""
    n_top = _check_body(body, engine.vocab.n_vocab)
    if body.stream and len(token_lists) > 1:
        raise GGFlowError(f"{len(token_lists)} prompts are answered whole: ask with stream false")
    pairs = [make_request(engine, t, body, NATIVE_DEFAULT_MAX_TOKENS, body.stream, n_top, grammar)
             for t in token_lists]
    shapes = [NativeShape(engine.vocab, model, body, t, i) for i, t in enumerate(token_lists)]
    if body.stream:
        from ggflow.serving.rerank import check_can_generate
        check_can_generate(http, engine)
        engine.submit(pairs[0][0])
        return StreamingResponse(_stream(pairs[0], shapes[0]), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        done = await complete(http, engine, pairs)
    except ClientGone:
        return Response(status_code=499)
    except GenerationFailed as exc:
        return error_response(500, str(exc), "server_error")
    out = [s.final(c, streamed=False) for s, c in zip(shapes, done)]
    return out if batch else out[0]


async def _stream(pair: tuple, shape: NativeShape):
    n = 0
    try:
        async for event in pieces(*pair):
            if isinstance(event, Piece):
                n += 1
                if event.text or event.logprob is not None:
                    yield _sse(shape.partial(event, n))
            else:
                yield _sse(shape.final(event.completion, streamed=True))
    except GenerationFailed as exc:
        yield _sse({"error": {"message": str(exc), "type": "server_error", "code": 500}})


def infill_tokens(vocab: Any, body: InfillBody, n_batch: int, n_ctx: int) -> list[int]:
    """llama-server's repo-level FIM prompt: [FIM_REP]myproject, each extra chunk after [FIM_SEP]filename,
    [FIM_SEP]filename, then [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]; the prefix keeps its last
    3/4 of a batch, the suffix what is left of the first quarter, the extra chunks the rest of the context."""
    sp = vocab.special
    missing = [name for name, t in (("prefix", sp.fim_pre), ("suffix", sp.fim_suf), ("middle", sp.fim_mid))
               if t is None]
    if missing:
        raise InfillUnsupported("Infill is not supported by this model: " +
                                " ".join(f"{m} token is missing." for m in missing))
    tok = lambda text: vocab.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
    mixed = lambda x: _tokenize_mixed(vocab, x, False) if isinstance(x, list) else tok(x)  # noqa: E731
    prefix, suffix = mixed(body.input_prefix), mixed(body.input_suffix)
    prompt = tok(body.prompt) if body.prompt else []
    extra: list[int] = []
    if sp.fim_rep is not None:
        extra += [sp.fim_rep, *tok(FIM_REPO_NAME)]
    for chunk in body.input_extra:
        extra += [sp.fim_sep, *tok(chunk.filename + "\n")] if sp.fim_sep is not None else tok(FIM_CHUNK_SEPARATOR)
        extra += tok(chunk.text)
    if sp.fim_sep is not None:
        extra += [sp.fim_sep, *tok(FIM_CURRENT_FILE)]
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_predict = body.token_limit(-1)
    n_extra = min(max(0, n_ctx - n_batch - 2 * max(n_predict, 0)), len(extra))
    head = [sp.fim_pre, *prefix[len(prefix) - n_prefix:], *prompt]
    tail = [sp.fim_suf, *suffix[:n_suffix]]
    bos = [vocab.bos_id] if vocab.add_bos and vocab.bos_id is not None else []
    return [*extra[len(extra) - n_extra:], *bos, *head, *tail, sp.fim_mid]


class InfillUnsupported(GGFlowError):
    """The vocabulary has no FIM tokens: 501, as llama-server answers."""


def tokenize_with_pieces(vocab: Any, tokens: list[int]) -> list[dict[str, Any]]:
    """/tokenize's with_pieces: each token's text, or its bytes where they are not whole UTF-8."""
    out = []
    for t in tokens:
        raw = vocab.token_to_piece(t, special=True)
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": t, "piece": piece})
    return out


def add_llama_routes(app: Any, state: Any, parse: Callable) -> None:
    @app.post("/completion")
    async def completion(http: HTTPRequest):
        body = await parse(http, NativeCompletionBody)
        engine = state.ready()
        body = body.model_copy(update={"logit_bias": native_logit_bias(engine.vocab, body.logit_bias)})
        lists, batch = prompt_token_lists(engine.vocab, body.prompt)
        return await run_native(http, engine, state.model_name, body, lists, batch, grammar=body.constraint())

    @app.post("/infill")
    async def infill(http: HTTPRequest):
        engine = state.ready()
        try:
            infill_tokens(engine.vocab, InfillBody(input_prefix="", input_suffix=""), 4, 4)
        except InfillUnsupported as exc:   # before the body: the model decides, as llama-server checks first
            return error_response(501, str(exc), "not_supported_error")
        body = await parse(http, InfillBody)
        tokens = infill_tokens(engine.vocab, body, engine.n_batch, engine.n_ctx)
        return await run_native(http, engine, state.model_name, body, [tokens], False, grammar=body.constraint())

    @app.post("/apply-template")
    async def apply_template(http: HTTPRequest):
        body = await parse(http, ApplyTemplateBody)
        state.ready()
        prompt = state.chat_template().render(body.messages, add_generation_prompt=body.add_generation_prompt,
                                              tools=body.tools, **(body.chat_template_kwargs or {}))
        return {"prompt": prompt}

    @app.post("/props")
    async def set_props(http: HTTPRequest):
        """llama-server's POST /props: no property of a running server can be changed (llama-server's
        handler changes none either); an empty object is accepted, a named property is refused."""
        given = (await parse(http, PropsBody)).model_extra if await http.body() else {}
        if given:
            raise GGFlowError(f"server properties are read-only while it runs: {', '.join(sorted(given))[:200]}")
        return {"success": True}


def props_generation_settings(engine: Any) -> dict[str, Any]:
    """GET /props' default_generation_settings as llama-server has it: a slot's context and the params."""
    params = dataclasses.asdict(SamplingParams())
    params = {k: v for k, v in params.items() if isinstance(v, (int, float, str, bool)) or v is None}
    params.update(seed=0xFFFFFFFF if params.get("seed") is None else params["seed"], n_predict=-1)
    return {"n_ctx": engine.n_ctx // max(1, len(engine.slots)), "params": params}


async def slot_file_action(http: HTTPRequest, state: Any, slot_id: int, action: str) -> Any:
    """/slots/{id}?action=save|restore with {"filename": ...} (serving/slot_files.py)."""
    import asyncio

    from ggflow.serving.slot_files import SlotFiles, SlotsDisabled

    engine = state.ready()
    files = getattr(state, "_slot_files", None)
    if files is None or files.engine is not engine:
        files = state._slot_files = SlotFiles(engine, state.slot_save_path)
    from ggflow.serving.app import _parse
    filename = (await _parse(http, SlotFileBody)).filename
    try:
        if action == "save":
            snap = await asyncio.wrap_future(engine.call_soon(lambda: files.snapshot(slot_id, filename)))
            return await asyncio.to_thread(files.write, slot_id, filename, snap)
        blob, _ = await asyncio.to_thread(files.read, filename)
        return await asyncio.wrap_future(engine.call_soon(lambda: files.restore(slot_id, filename, blob)))
    except SlotsDisabled as exc:
        return error_response(501, str(exc), "not_supported_error")


def read_template_file(path: str) -> str:
    """--chat-template-file's text; GGFlowError naming the file if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise GGFlowError(f"--chat-template-file {path}: {exc}") from None
