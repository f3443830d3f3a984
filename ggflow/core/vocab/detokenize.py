"""Ids back to text: byte-level pieces, llama.cpp's clean_spaces passes, and the streaming decoder.

Detokenizing applies llama.cpp's piece rules (Vocab.token_to_piece), leading-space removal and the
``clean_spaces`` passes; StreamDecoder gives the same text one token at a time.
"""
from __future__ import annotations

import codecs
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ggflow.core.vocab.vocab import Vocab

def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet, as a map from its characters back to bytes."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


_BYTE_OF_CHAR = _bytes_to_unicode()


def byte_level_decode(text: str) -> bytes:
    """llama_decode_text: byte-level characters back to bytes; a character outside the byte
    alphabet becomes llama.cpp's "[UNK_BYTE_0x..<token>]" marker."""
    out = bytearray()
    for c in text:
        b = _BYTE_OF_CHAR.get(c)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


_SPACE_BEFORE_PUNCT = re.compile(rb" (?=[?!.,])")
_SPACES_AROUND_APOSTROPHE = re.compile(rb" ' ")
_SPACE_BEFORE_CONTRACTION = re.compile(rb" (?='(?:[sm]|re|ve))")


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's three clean_spaces passes: " ?"/" !"/" ."/" ," lose the space; " ' " becomes
    "'" (left to right, a space used once); " 's", " 'm", " 're", " 've" lose the space."""
    text = _SPACE_BEFORE_PUNCT.sub(b"", text)
    text = _SPACES_AROUND_APOSTROPHE.sub(b"'", text)
    return _SPACE_BEFORE_CONTRACTION.sub(b"", text)


class _StreamingCleaner:
    """clean_spaces over a stream of byte chunks: holds back only the bytes a later chunk could
    still change, so the concatenated output equals clean_spaces of the concatenated input."""

    _CONTRACTION_PREFIXES = (b" 'r", b" 'v", b" '", b" ")

    def __init__(self):
        self.pass1_held = b""       # a trailing space: dropped if "?!.," follows
        self.pass2_held = b""       # b" " or b" '": the start of a possible " ' "
        self.pass3_held = b""       # a prefix of " 's" / " 'm" / " 're" / " 've"

    def push(self, data: bytes) -> bytes:
        return self._pass3(self._pass2(self._pass1(data)))

    def finish(self) -> bytes:
        """The held bytes, run through the passes that come after the one holding them."""
        rest = self.pass1_held
        rest = self._pass2(rest) + self.pass2_held
        rest = self._pass3(rest) + self.pass3_held
        self.pass1_held = self.pass2_held = self.pass3_held = b""
        return rest

    def _pass1(self, data: bytes) -> bytes:
        data = self.pass1_held + data
        self.pass1_held = b" " if data.endswith(b" ") else b""
        return _SPACE_BEFORE_PUNCT.sub(b"", data[:len(data) - len(self.pass1_held)])

    def _pass2(self, data: bytes) -> bytes:
        out = bytearray()
        held = self.pass2_held
        for c in data:
            ch = bytes((c,))
            if held == b" '" and ch == b" ":
                out += b"'"             # " ' " -> "'", both spaces used up
                held = b""
            elif held == b" " and ch == b"'":
                held = b" '"
            elif ch == b" ":
                out += held
                held = b" "
            else:
                out += held + ch
                held = b""
        self.pass2_held = held
        return bytes(out)

    def _pass3(self, data: bytes) -> bytes:
        data = self.pass3_held + data
        self.pass3_held = next((p for p in self._CONTRACTION_PREFIXES if data.endswith(p)), b"")
        return _SPACE_BEFORE_CONTRACTION.sub(b"", data[:len(data) - len(self.pass3_held)])


class StreamDecoder:
    """Token ids in, text out, one token at a time, as ``detokenize`` of all of them would give.

    feed() returns only complete UTF-8 characters: an incomplete multi-byte sequence (a character
    split over byte tokens) waits for the rest, and so do the few bytes ``clean_spaces`` or a
    trailing EOS (with remove_special) could still change. flush() ends the stream, returns what
    was held back, and readies the decoder for a new stream.
    """

    def __init__(self, vocab: Vocab, remove_special: bool = False, unparse_special: bool = False):
        self.vocab, self.remove_special, self.unparse_special = vocab, remove_special, unparse_special
        self._reset()

    def _reset(self) -> None:
        self._n_fed = 0
        self._remove_space = self.vocab.flags.add_space_prefix
        self._first_piece = True
        self._held_eos = False
        self._cleaner = _StreamingCleaner() if self.vocab.flags.clean_spaces else None
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int) -> str:
        v = self.vocab
        tid = v._check_id(token_id)
        self._n_fed += 1
        if self.remove_special and v.add_bos and self._n_fed == 1 and tid == v.bos_id:
            self._remove_space = False
            return ""
        data = b""
        if self._held_eos:          # the EOS was not the last token after all
            data += self._piece(v.eos_id)
            self._held_eos = False
        if self.remove_special and v.add_eos and tid == v.eos_id:
            self._held_eos = True
        else:
            data += self._piece(tid)
        return self._decode(data, final=False)

    def flush(self) -> str:
        tail = self._cleaner.finish() if self._cleaner else b""
        text = self._decode(tail, final=True)
        self._reset()
        return text

    def _piece(self, tid: int) -> bytes:
        piece = self.vocab.token_to_piece(tid, self.unparse_special)
        if self._first_piece:
            self._first_piece = False
            if self._remove_space and piece.startswith(b" "):
                piece = piece[1:]
        return piece

    def _decode(self, data: bytes, final: bool) -> str:
        if self._cleaner is not None and not final:
            data = self._cleaner.push(data)
        return self._utf8.decode(data, final)
