"""OpenAI's Responses API on ggflow serve, stateless: POST /v1/responses (and /responses), plain and streamed.

``input`` (a string, or message / function_call / function_call_output items) and ``instructions`` become chat
messages rendered with the model's template; the reply is a message item with output_text (a reasoning
item first when the model thought, function_call items for tool calls). Nothing is stored: a request naming
``previous_response_id`` is refused. Refusals have OpenAI's error shape."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, Union

from fastapi import Request as HTTPRequest
from fastapi.responses import Response, StreamingResponse

from ggflow.errors import GGFlowError
from ggflow.generation.records import Completion
from ggflow.generation.request import Piece
from ggflow.serving.chat_prep import PreparedChat, prepare_chat
from ggflow.serving.native_run import ClientGone, GenerationFailed, complete, make_request, pieces
from ggflow.serving.openai_params import GenerationBody
from ggflow.serving.reasoning import ReasoningSplitter, split_reasoning
from ggflow.serving.responses import error_response


class ResponsesBody(GenerationBody):
    input: Union[str, list[dict[str, Any]]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def token_limit(self, default: int) -> int:
        if self.max_output_tokens is not None:
            return default if self.max_output_tokens < 0 else self.max_output_tokens
        return super().token_limit(default)


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise GGFlowError(f"{where} must be a string or a list of content parts")
    parts = []
    for i, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            parts.append(p["text"])
        elif kind in ("input_image", "input_file"):
            raise GGFlowError(f"{where}[{i}]: {kind} is not supported: this server has no vision model")
        else:
            raise GGFlowError(f"{where}[{i}] must be an input_text part with a string text")
    return "\n".join(parts)


def chat_messages(body: ResponsesBody) -> list[dict[str, Any]]:
    """instructions and input as OpenAI chat messages."""
    out: list[dict[str, Any]] = []
    if body.instructions is not None:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return out + [{"role": "user", "content": body.input}]
    for n, item in enumerate(body.input):
        kind = item.get("type", "message")
        where = f"input[{n}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise GGFlowError(f"{where}.role must be system, developer, user or assistant")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _content_text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments", "{}"), str):
                raise GGFlowError(f"{where}: a function_call needs a string name and string arguments")
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments", "{}")}}
            if out and out[-1]["role"] == "assistant" and not out[-1]["content"]:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue
        else:
            raise GGFlowError(f"{where}: items of type {kind!r} are not supported")
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools as chat's nested ones."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise GGFlowError(f"tools[{i}] must be a function tool with a name (built-in tools are not served)")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                     if k in t}})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


class ResponseShape:
    def __init__(self, body: ResponsesBody, model: str, prep: PreparedChat):
        self.body, self.model, self.prep = body, model, prep
        self.id, self.msg_id = f"resp_{uuid.uuid4().hex[:24]}", f"msg_{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def envelope(self, status: str, output: list, c: Completion | None) -> dict[str, Any]:
        res: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.body.model or self.model, "output": output, "error": None, "incomplete_details": None,
            "instructions": self.body.instructions, "max_output_tokens": self.body.max_output_tokens,
            "parallel_tool_calls": self.body.parallel_tool_calls, "tool_choice": self.body.tool_choice or "auto",
            "tools": self.body.tools or [], "temperature": self.body.temperature, "top_p": self.body.top_p,
            "metadata": self.body.metadata or {}, "store": False, "text": {"format": {"type": "text"}}}
        if c is not None:
            cached = c.timings.cached_n
            res["usage"] = {"input_tokens": len(c.prompt_tokens), "output_tokens": len(c.tokens),
                            "total_tokens": len(c.prompt_tokens) + len(c.tokens),
                            "input_tokens_details": {"cached_tokens": cached},
                            "output_tokens_details": {"reasoning_tokens": 0}}
            if c.finish_reason == "length":
                res["status"] = "incomplete"
                res["incomplete_details"] = {"reason": "max_output_tokens"}
        return res

    def message(self, text: str) -> dict[str, Any]:
        return {"type": "message", "id": self.msg_id, "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    @staticmethod
    def reasoning(text: str) -> dict[str, Any]:
        return {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex[:24]}", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    @staticmethod
    def function_call(call: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}

    def output(self, c: Completion) -> list[dict[str, Any]]:
        reasoning, text = split_reasoning(c.text, "auto", self.prep.in_think)
        calls = []
        if self.prep.tools is not None:
            message, _ = self.prep.tools.reply(text, c.finish_reason)
            text, calls = message.get("content") or "", message.get("tool_calls") or []
        items = [self.reasoning(reasoning)] if reasoning else []
        if text or not calls:
            items.append(self.message(text))
        return items + [self.function_call(call) for call in calls]


def add_responses_routes(app: Any, state: Any, parse: Callable) -> None:
    @app.post("/v1/responses")
    @app.post("/responses")
    async def responses(http: HTTPRequest):
        body = await parse(http, ResponsesBody)
        if body.previous_response_id is not None:
            raise GGFlowError("this server is stateless: previous_response_id cannot be followed; send the whole "
                              "conversation as input")
        engine = state.ready()
        prep = prepare_chat(state, engine, chat_messages(body), chat_tools(body.tools), _tool_choice(body.tool_choice),
                            body.chat_template_kwargs, grammar=body.constraint(),
                            parallel_tool_calls=body.parallel_tool_calls)
        pair = make_request(engine, prep.tokens, body, engine.n_ctx, body.stream, grammar=prep.grammar)
        shape = ResponseShape(body, state.model_name, prep)
        if body.stream:
            from ggflow.serving.rerank import check_can_generate
            check_can_generate(http, engine)
            engine.submit(pair[0])
            return StreamingResponse(_stream(pair, shape), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            (c,) = await complete(http, engine, [pair])
        except ClientGone:
            return Response(status_code=499)
        except GenerationFailed as exc:
            return error_response(500, str(exc), "server_error")
        return shape.envelope("completed", shape.output(c), c)


async def _stream(pair: tuple, shape: ResponseShape):
    seq = 0

    def event(kind: str, **payload: Any) -> str:
        nonlocal seq
        seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **payload}, ensure_ascii=False)}\n\n"

    yield event("response.created", response=shape.envelope("in_progress", [], None))
    yield event("response.in_progress", response=shape.envelope("in_progress", [], None))
    splitter = ReasoningSplitter(True, shape.prep.in_think)
    calls = shape.prep.tools.stream() if shape.prep.tools is not None else None
    text, reasoning, opened = [], [], False
    ids = {"item_id": shape.msg_id, "output_index": 0, "content_index": 0}

    def open_message():
        nonlocal opened
        if not opened:
            opened = True
            yield event("response.output_item.added", output_index=0,
                        item={**shape.message(""), "status": "in_progress", "content": []})
            yield event("response.content_part.added", **ids,
                        part={"type": "output_text", "text": "", "annotations": []})

    def deltas(r: str, t: str):
        reasoning.append(r)
        if t and calls is not None:
            t = calls.feed(t)
        if not t:
            return
        yield from open_message()
        text.append(t)
        yield event("response.output_text.delta", **ids, delta=t, logprobs=[])

    try:
        async for ev in pieces(*pair):
            if isinstance(ev, Piece):
                for line in deltas(*splitter.feed(ev.text)):
                    yield line
                continue
            c = ev.completion
            for line in deltas(*splitter.finish()):
                yield line
            found = []
            if calls is not None:
                rest, found = calls.finish()
                calls = None
                for line in deltas("", rest):
                    yield line
            full = "".join(text)
            output = []
            if "".join(reasoning):
                output.append(shape.reasoning("".join(reasoning)))
            if opened or not found:
                for line in open_message():
                    yield line
                yield event("response.output_text.done", **ids, text=full, logprobs=[])
                yield event("response.content_part.done", **ids,
                            part={"type": "output_text", "text": full, "annotations": []})
                yield event("response.output_item.done", output_index=0, item=shape.message(full))
                output.append(shape.message(full))
            for call in found:
                item = shape.function_call(call.as_openai())
                yield event("response.output_item.added", output_index=len(output), item={**item, "arguments": ""})
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=len(output),
                            delta=item["arguments"])
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=len(output),
                            arguments=item["arguments"])
                yield event("response.output_item.done", output_index=len(output), item=item)
                output.append(item)
            yield event("response.completed", response=shape.envelope("completed", output, c))
    except GenerationFailed as exc:
        yield event("error", code="server_error", message=str(exc), param=None)
