"""Text <-> tokens on an LLM, with llama-cpp-python's signatures and ggflow's older keywords.

llama-cpp-python: ``tokenize(text: bytes, add_bos=True, special=False)`` and
``detokenize(tokens, prev_tokens=None, special=False) -> bytes``. ggflow took ``tokenize(str, add_special,
parse_special)`` (the same flags, in the same places) and returned ``str`` from detokenize: both keyword
spellings are accepted, text may be str or bytes, and detokenize's bytes also compare equal to their text.
"""
from __future__ import annotations

from typing import Any, Sequence

from ggflow.api import arguments as A


class DetokenizedBytes(bytes):
    """The bytes detokenize gives (as llama-cpp-python), equal also to their UTF-8 text, as ggflow's detokenize
    returned str. ``.text`` is that text (invalid UTF-8 as U+FFFD)."""

    @property
    def text(self) -> str:
        return self.decode("utf-8", errors="replace")

    def __eq__(self, other: object) -> bool:
        return self.text == other if isinstance(other, str) else bytes.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = bytes.__hash__


class TokensMixin:
    vocab: Any

    def tokenize(self, text: "bytes | str", add_bos: bool = True, special: bool = False, *,
                 add_special: bool | None = None, parse_special: bool | None = None) -> list[int]:
        """Token ids of a text. add_bos (ggflow: add_special): add the BOS/EOS the model asks for;
        special (ggflow: parse_special): text like "<|im_end|>" becomes that special token."""
        text = A.check_text(text)
        add = A.check_bool("add_bos", add_bos if add_special is None else add_special)
        parse = A.check_bool("special", special if parse_special is None else parse_special)
        return self.vocab.tokenize(text, add_special=add, parse_special=parse)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False,
                   *, remove_special: bool = False) -> DetokenizedBytes:
        """The bytes of tokens. With prev_tokens, only what these tokens add after them (spacing rules at the
        start of a text apply to prev_tokens, not here). special: control tokens as their text."""
        n_vocab = self.vocab.n_vocab
        ids = A.check_token_ids(tokens, n_vocab, "tokens")
        special = A.check_bool("special", special)
        remove = A.check_bool("remove_special", remove_special)
        if prev_tokens is None:
            return DetokenizedBytes(self.vocab.detokenize_bytes(ids, remove, special))
        prev = A.check_token_ids(prev_tokens, n_vocab, "prev_tokens")
        whole = self.vocab.detokenize_bytes(prev + ids, remove, special)
        return DetokenizedBytes(whole[len(self.vocab.detokenize_bytes(prev, remove, special)):])
