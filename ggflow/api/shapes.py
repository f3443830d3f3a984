"""The dicts llama-cpp-python (and the OpenAI API) return: text completions, chat completions, their stream
chunks, embeddings. Plain functions of their fields, so the server can build the same shapes."""
from __future__ import annotations

import time
import uuid
from typing import Any


def completion_id(prefix: str = "cmpl") -> str:
    return f"{prefix}-{uuid.uuid4()}"


def now() -> int:
    return int(time.time())


def usage(n_prompt: int, n_completion: int) -> dict[str, int]:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion}


def text_completion(ident: str, created: int, model: str, text: str, logprobs: Any, finish_reason: str | None,
                    n_prompt: int, n_completion: int) -> dict[str, Any]:
    return {"id": ident, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}],
            "usage": usage(n_prompt, n_completion)}


def completion_chunk(ident: str, created: int, model: str, text: str, logprobs: Any,
                     finish_reason: str | None) -> dict[str, Any]:
    return {"id": ident, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}]}


def chat_completion(ident: str, created: int, model: str, content: str, logprobs: Any, finish_reason: str,
                    n_prompt: int, n_completion: int) -> dict[str, Any]:
    return {"id": ident, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "logprobs": logprobs, "finish_reason": finish_reason}],
            "usage": usage(n_prompt, n_completion)}


def chat_chunk(ident: str, created: int, model: str, delta: dict[str, Any], logprobs: Any,
               finish_reason: str | None) -> dict[str, Any]:
    return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}


def embedding_list(model: str, vectors: list, n_tokens: int) -> dict[str, Any]:
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
