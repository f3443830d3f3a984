"""A conversation as prompt tokens: the model's chat template, rendered and tokenized as LLM does it
(ggflow/api/chat_tokens.py: message text stays text, whatever special-token text it spells)."""
from __future__ import annotations

from ggflow.api.chat_tokens import chat_prompt_tokens

__all__ = ["chat_prompt_tokens"]
