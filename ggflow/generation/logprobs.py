"""Log-probabilities of tokens under the model (the raw logits, before any sampler), and the shapes
llama-cpp-python (text completions) and OpenAI (chat) report them in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass
class TokenLogprob:
    token: int
    logprob: float | None              # None for a token nothing predicted (the first of a prompt)
    top: list[tuple[int, float]]       # the most likely tokens at that position, most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log softmax in float32 (max-shifted, as llama-cpp-python's logits_to_logprobs)."""
    x = np.asarray(logits, dtype=np.float32)
    peak = np.max(x, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    shifted = x - peak
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def top_logprobs(lp: np.ndarray, n: int) -> list[tuple[int, float]]:
    if n <= 0:
        return []
    n = min(n, lp.shape[-1])
    part = np.argpartition(-lp, n - 1)[:n]
    part = part[np.argsort(-lp[part], kind="stable")]
    return [(int(i), float(lp[i])) for i in part]


def token_logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """The log-probability of ``token`` under one position's logits, and the ``n_top`` most likely."""
    lp = log_softmax(logits)
    return TokenLogprob(int(token), float(lp[token]), top_logprobs(lp, n_top))


def sequence_logprobs(logits: np.ndarray, tokens: Sequence[int], n_top: int) -> list[TokenLogprob]:
    """Per token of a sequence, from the logits of every position ([n, n_vocab]): token i is scored by
    row i - 1; the first token has no score."""
    lp = log_softmax(logits)
    out = [TokenLogprob(int(tokens[0]), None, [])] if len(tokens) else []
    for i in range(1, len(tokens)):
        out.append(TokenLogprob(int(tokens[i]), float(lp[i - 1, tokens[i]]), top_logprobs(lp[i - 1], n_top)))
    return out


def _piece(vocab: Any, token: int) -> str:
    return vocab.token_to_piece(token, special=False).decode("utf-8", errors="ignore")


def completion_logprobs(vocab: Any, entries: Sequence[TokenLogprob], text_offset: int) -> dict[str, list]:
    """llama-cpp-python's (and OpenAI's legacy completions') ``logprobs``: tokens, text_offset,
    token_logprobs, top_logprobs ({token text: logprob}, the chosen token's included)."""
    tokens, offsets, token_logprobs, top_logprobs = [], [], [], []
    offset = text_offset
    for e in entries:
        text = _piece(vocab, e.token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        token_logprobs.append(e.logprob)
        if e.logprob is None:
            top_logprobs.append(None)
        else:
            top = {_piece(vocab, t): lp for t, lp in e.top}
            top[text] = e.logprob
            top_logprobs.append(top)
    return {"tokens": tokens, "text_offset": offsets, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs}


def chat_logprobs(vocab: Any, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": None}."""
    def item(token: int, logprob: float) -> dict[str, Any]:
        raw = vocab.token_to_piece(token, special=False)
        return {"token": raw.decode("utf-8", errors="ignore"), "logprob": logprob, "bytes": list(raw)}
    return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries],
            "refusal": None}


def without_eog(vocab: Any, tokens: Sequence[int]) -> list[int]:
    """The generated tokens as llama-cpp-python and OpenAI count them: an end-of-generation token is not one."""
    return list(tokens[:-1]) if len(tokens) and vocab.is_eog(tokens[-1]) else list(tokens)


def generated_entries(vocab: Any, completion: Any) -> list[TokenLogprob]:
    """A completion's logprobs entries without the end-of-generation token's."""
    return list(completion.logprobs[: len(without_eog(vocab, completion.tokens))])


def echoed_entries(vocab: Any, completion: Any) -> list[TokenLogprob]:
    """``echo`` with logprobs: the prompt's entries (after a BOS), then the generated ones. As OpenAI and
    llama-cpp-python, the first echoed token has no score."""
    first = 1 if completion.prompt_tokens[:1] == [vocab.bos_id] else 0
    head = list(completion.prompt_logprobs[first:])
    if head:
        head[0] = TokenLogprob(head[0].token, None, [])
    return head + generated_entries(vocab, completion)
