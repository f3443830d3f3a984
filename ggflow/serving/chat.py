"""A conversation as prompt tokens: the model's chat template, rendered and tokenized as LLM does it."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def chat_prompt_tokens(template: Any, vocab: Any, messages: Sequence[Mapping[str, Any]],
                       tools: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> list[int]:
    """Render with the generation prompt (``kwargs`` are template variables); special tokens in the text are
    parsed, BOS added unless written."""
    prompt = template.render(messages, add_generation_prompt=True, tools=tools, **kwargs)
    bos = vocab.bos_id
    has_bos = bos is not None and prompt.startswith(vocab.token_text(bos))  # the template wrote it
    return vocab.tokenize(prompt, add_special=not has_bos, parse_special=True)
