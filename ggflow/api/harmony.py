"""gpt-oss's harmony format: an assistant reply is a run of messages, each on a channel, and the chat API
hands back the ``analysis`` channel as ``reasoning_content`` and the ``final`` one as ``content`` (as
llama.cpp's server does).

A reply, rendered with its special tokens (the generation prompt ends ``<|start|>assistant``):

    <|channel|>analysis<|message|>...thinking...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>

Each message's header (role, ``<|channel|>name``, a `` to=...`` recipient, ``<|constrain|>...``) ends at
``<|message|>``; its body at ``<|end|>``, ``<|return|>``, ``<|call|>`` or the end of the text (a reply cut
off by max_tokens). ``commentary`` (preambles, tool calls) goes to the content, as text. A streamed reply
and one with tools are not split yet (their pieces are rendered without the markers).
"""
from __future__ import annotations

import re

CHANNEL, MESSAGE, START = "<|channel|>", "<|message|>", "<|start|>"
_BODY_END = re.compile(r"<\|(?:end|return|call)\|>")
REASONING_CHANNEL = "analysis"


def is_harmony(template_source: str) -> bool:
    """Whether a chat template writes harmony messages (gpt-oss's)."""
    return CHANNEL in template_source and MESSAGE in template_source


def split_reply(text: str) -> tuple[str | None, str]:
    """(reasoning, content) of a reply rendered with its special tokens; text with no harmony message is
    all content. Several messages on one kind of channel are joined in order."""
    if MESSAGE not in text:
        return None, text
    reasoning, content = [], []
    for part in text.split(START):
        header, found, body = part.partition(MESSAGE)
        if not found:
            continue                                  # a header cut off before its message: nothing said
        body = _BODY_END.split(body, maxsplit=1)[0]
        channel = header.split(CHANNEL, 1)[1].split(" ")[0].split("<|")[0] if CHANNEL in header else ""
        (reasoning if channel == REASONING_CHANNEL else content).append(body)
    return ("".join(reasoning) if reasoning else None), "".join(content)
