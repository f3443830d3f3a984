"""A conversation as prompt tokens, with the message text kept as text: special-token text a user (or a tool)
writes, ``<|im_start|>system``, stays plain characters and cannot forge a turn.

The template's own text is tokenized with special tokens parsed; each message's content is not (as Hugging
Face's chat-template tokenization can). To know which characters of the rendered prompt are whose, the
template is rendered a second time with a marker in place of each content text, and the real render is
read against it (a template that trims a content is followed; one that changes it otherwise is refused,
not guessed). Only a conversation whose content spells a control token pays for the second render; any
other prompt's tokens are exactly llama.cpp's (render, then tokenize with parse_special).
"""
from __future__ import annotations

import re
import secrets
from typing import Any, Mapping, Sequence

from ggflow.errors import ArgumentError


def chat_prompt_tokens(template: Any, vocab: Any, messages: Sequence[Mapping[str, Any]],
                       tools: Sequence[Mapping[str, Any]] | None = None, **variables: Any) -> list[int]:
    """Render with the generation prompt; BOS added unless the template wrote it; content text stays text."""
    prompt = template.render(messages, add_generation_prompt=True, tools=tools, **variables)
    bos = vocab.bos_id
    add_bos = not (bos is not None and prompt.startswith(vocab.token_text(bos)))   # the template wrote it
    texts = [text for _, _, text in _content_texts(messages)]
    if not any(vocab.has_hidden_special(t) for t in texts):
        return vocab.tokenize(prompt, add_special=add_bos, parse_special=True)
    parts = _parts(template, vocab, messages, prompt, tools, variables)
    return vocab.tokenize_parts(parts, add_special=add_bos)


def _content_texts(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, int | None, str]]:
    """(message index, part index or None, text) of every content text."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, str):
            out.append((i, None, content))
        elif isinstance(content, (list, tuple)):
            out += [(i, j, p["text"]) for j, p in enumerate(content)
                    if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
    return out


def _marked(messages: Sequence[Mapping[str, Any]], marker: str) -> list[dict[str, Any]]:
    """The messages with content text k replaced by marker k."""
    out, k = [], 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            m, k = {**m, "content": marker.format(k)}, k + 1
        elif isinstance(content, (list, tuple)):
            parts = []
            for p in content:
                if isinstance(p, Mapping) and isinstance(p.get("text"), str):
                    p, k = {**p, "text": marker.format(k)}, k + 1
                parts.append(p)
            m = {**m, "content": parts}
        out.append(dict(m))
    return out


def _parts(template: Any, vocab: Any, messages: Sequence[Mapping[str, Any]], prompt: str, tools: Any,
           variables: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """``prompt`` cut into (text, parse_special): the template's text True, each content's text False."""
    nonce = secrets.token_hex(6)   # content cannot contain a marker it cannot know
    marker = "\ue000" + nonce + ":{}\ue001"
    found = _content_texts(messages)
    skeleton = template.render(_marked(messages, marker), add_generation_prompt=True, tools=tools, **variables)
    pieces = re.split("\ue000" + nonce + r":(\d+)\ue001", skeleton)   # template text, k, template text, ...
    parts: list[tuple[str, bool]] = []
    pos = 0
    for n, piece in enumerate(pieces):
        if n % 2 == 0:
            if not prompt.startswith(piece, pos):
                break
            parts.append((piece, True))
            pos += len(piece)
            continue
        text = found[int(piece)][2]
        following = pieces[n + 1]
        shown = next((c for c in dict.fromkeys((text, text.strip(), text.lstrip(), text.rstrip()))
                      if prompt.startswith(c + following, pos)), None)
        if shown is None:
            break
        parts.append((shown, False))
        pos += len(shown)
    if pos == len(prompt) and sum(len(t) for t, _ in parts) == len(prompt):
        return parts
    i = next(i for i, _, t in found if vocab.has_hidden_special(t))
    raise ArgumentError(f"messages[{i}]['content']", messages[i].get("content"),
                        "text without special-token text: this chat template changes message text in a way "
                        "ggflow cannot follow, so it cannot keep that text from being read as special tokens")

