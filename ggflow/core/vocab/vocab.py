"""Vocab: a GGUF file's tokenizer, with llama.cpp's tokenize / detokenize / token_to_piece.

Around the two engines (spm.py, bpe.py), llama.cpp's own steps: special tokens are cut out of the text
first (control and unknown tokens only when ``parse_special``; user-defined tokens always, as llama.cpp
and Hugging Face do), BOS/EOS are added per ``add_bos``/``add_eos``, and each token has its piece.
Python strings cannot hold invalid UTF-8 but can hold lone surrogates: ``tokenize`` replaces each with
U+FFFD (what llama.cpp makes of bytes it cannot decode), after joining well-formed surrogate pairs into
the character they encode.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ggflow.core.vocab.attrs import BYTE, CONTROL, HIDDEN, LSTRIP, NORMAL, RSTRIP, VERBATIM, TokenAttr
from ggflow.core.vocab.bpe import build_bpe_tokenizer
from ggflow.core.vocab.detokenize import StreamDecoder, byte_level_decode, clean_spaces
from ggflow.core.vocab.errors import InvalidTokenError, TokenizerError
from ggflow.core.vocab.load import load_vocab, read_tokenizer_metadata, reader_metadata
from ggflow.core.vocab.spm import SpmMerger
from ggflow.core.vocab.wpm import PHANTOM_SPACE, build_wpm_tokenizer

if TYPE_CHECKING:
    import gguf

_SPACE_MARK = "\u2581"      # SentencePiece's visible space
_C_SPACE = " \t\n\v\f\r"    # C isspace() in the "C" locale: what lstrip/rstrip attributes strip
# a fragment longer than this is encoded with ``encode_batch``, which releases the GIL (``encode`` holds it for
# the whole text: seconds for 1 MiB, while a server's event loop waits)
_LONG_FRAGMENT = 4096


def _well_formed(text: str) -> str:
    """Python text as UTF-8 can carry it: surrogate pairs joined, lone surrogates -> U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class Vocab:
    """A GGUF file's tokenizer, with llama.cpp's tokenize / detokenize / token_to_piece."""

    def __init__(self, meta: Mapping[str, Any], source: str = "<metadata>"):
        loaded = load_vocab(meta, source)
        self.source, self.model, self.pre = source, loaded.model, loaded.pre
        self.pre_type = loaded.pre_settings.pre_type if loaded.pre_settings else "DEFAULT"
        self._tokens, self._scores, self._attrs = loaded.tokens, loaded.scores, loaded.attrs
        self._token_to_id = loaded.token_to_id
        self.flags, self.special, self._special_order = loaded.flags, loaded.special, loaded.special_order
        self._pieces: list[bytes | None] = [None] * len(self._tokens)
        if self.model == "llama":
            self._spm, self.hf_tokenizer = SpmMerger(self._token_to_id, self._scores), None
        elif self.model == "bert":
            self._spm = None
            self.hf_tokenizer = build_wpm_tokenizer(self._tokens, self._attrs, self.special.unk,
                                                    self.flags.lowercase, self.flags.strip_accents)
        else:
            self._spm = None
            self.hf_tokenizer = build_bpe_tokenizer(self._tokens, loaded.merges, loaded.pre_settings,
                                                    self.flags.ignore_merges)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Vocab":
        """Read only the tokenizer metadata of a GGUF file (no tensors)."""
        return cls(read_tokenizer_metadata(path), str(path))

    @classmethod
    def from_gguf_reader(cls, reader: "gguf.GGUFReader") -> "Vocab":
        source = str(getattr(reader.data, "filename", None) or "<gguf>")
        return cls(reader_metadata(reader), source)

    # ---- facts --------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        return self.special.bos

    @property
    def eos_id(self) -> int | None:
        return self.special.eos

    @property
    def eot_id(self) -> int | None:
        return self.special.eot

    @property
    def add_bos(self) -> bool:
        return self.flags.add_bos

    @property
    def add_eos(self) -> bool:
        return self.flags.add_eos

    def _check_id(self, token_id: int) -> int:
        tid = int(token_id)
        if not 0 <= tid < len(self._tokens):
            raise InvalidTokenError(f"token id {tid} is outside this vocabulary [0, {len(self._tokens)})")
        return tid

    def text_to_token(self, text: str) -> int | None:
        """The id of the vocabulary entry spelled exactly ``text`` (as stored), or None."""
        return self._token_to_id.get(text)

    def token_text(self, token_id: int) -> str:
        """The token as the vocabulary stores it (byte-level characters, "▁" for SPM spaces)."""
        return self._tokens[self._check_id(token_id)]

    def token_attr(self, token_id: int) -> TokenAttr:
        return TokenAttr(int(self._attrs[self._check_id(token_id)]))

    def is_eog(self, token_id: int) -> bool:
        return self._check_id(token_id) in self.special.eog

    def is_control(self, token_id: int) -> bool:
        return bool(self._attrs[self._check_id(token_id)] & CONTROL)

    def __repr__(self) -> str:
        return (f"Vocab({self.model}/{self.pre_type}, {self.n_vocab} tokens, bos={self.bos_id}, "
                f"eos={self.eos_id}, add_bos={self.add_bos})")

    # ---- text -> ids --------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize: add_special adds BOS/EOS as the vocabulary asks; parse_special lets
        control tokens written in the text become those tokens."""
        return self.tokenize_parts([(text, parse_special)], add_special)

    def tokenize_parts(self, parts: "Iterable[tuple[str, bool]]", add_special: bool = True) -> list[int]:
        """``tokenize`` of the parts' concatenation, each part's special-token text parsed only where its flag
        says (a chat template's text: yes; a message's content: no). Plain text that runs across parts is
        tokenized as one piece, so without special-token text in a False part the tokens are tokenize's."""
        fragments: list[str | int] = []
        for text, parse_special in parts:
            text = _well_formed(text)
            for fragment in self._partition(text, parse_special) if text else []:
                if isinstance(fragment, str) and fragments and isinstance(fragments[-1], str):
                    fragments[-1] += fragment
                else:
                    fragments.append(fragment)
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self._required(self.bos_id, "BOS"))
        if self._spm is not None:
            self._tokenize_spm(fragments, out)
        else:
            self._tokenize_bpe(fragments, out)
        if add_special and self.add_eos:
            out.append(self._required(self.eos_id, "EOS"))
        if add_special and self.flags.add_sep:
            out.append(self._required(self.special.sep, "SEP"))
        return out

    def has_hidden_special(self, text: str) -> bool:
        """Whether ``text`` spells a control (or unknown) token, which tokenize reads as that token only with
        parse_special."""
        return any(int(self._attrs[tid]) & HIDDEN and self._tokens[tid] in text for tid in self._special_order)

    def _required(self, tid: int | None, what: str) -> int:
        if tid is None:
            raise TokenizerError(f"{self.source}: the vocabulary asks for a {what} token but has none")
        return tid

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """tokenizer_st_partition: cut special tokens out, longest first, into token ids."""
        fragments: list[str | int] = [text]
        for tid in self._special_order:
            attr = int(self._attrs[tid])
            if not parse_special and attr & HIDDEN:
                continue
            special = self._tokens[tid]
            if special not in text:
                continue
            lstrip, rstrip = bool(attr & LSTRIP), bool(attr & RSTRIP)
            cut: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, str) and special in fragment:
                    cut += _cut_out(fragment, special, tid, lstrip, rstrip)
                else:
                    cut.append(fragment)
            fragments = cut
        return fragments

    def _tokenize_spm(self, fragments: list[str | int], out: list[int]) -> None:
        after_special = True
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
                after_special = True
                continue
            if self.flags.add_space_prefix and after_special:
                fragment = " " + fragment
            out += self._spm.encode(fragment.replace(" ", _SPACE_MARK))
            after_special = False

    def _tokenize_bpe(self, fragments: list[str | int], out: list[int]) -> None:
        missing = len(self._tokens)        # build_bpe_tokenizer's placeholder for a byte not in the vocab
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
                continue
            if len(fragment) > _LONG_FRAGMENT:   # the same ids; encode_batch lets other threads run meanwhile
                ids = self.hf_tokenizer.encode_batch([fragment], add_special_tokens=False)[0].ids
            else:
                ids = self.hf_tokenizer.encode(fragment, add_special_tokens=False).ids
            out += [i for i in ids if i != missing] if missing in ids else ids

    # ---- ids -> text --------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """llama_token_to_piece: the bytes one token stands for. Control and unknown tokens give
        their text only when ``special``; a byte token <0xNN> gives that byte."""
        tid = self._check_id(token_id)
        if not special and self._attrs[tid] & HIDDEN:
            return b""
        piece = self._pieces[tid]
        if piece is None:
            piece = self._pieces[tid] = self._make_piece(tid)
        return piece

    def _make_piece(self, tid: int) -> bytes:
        text, attr = self._tokens[tid], int(self._attrs[tid])
        if attr & VERBATIM:
            return text.encode("utf-8")
        if attr & NORMAL:
            if self.model == "llama":
                return text.replace(_SPACE_MARK, " ").encode("utf-8")
            if self.model == "bert":   # phantom spaces mark word starts (llama_unescape_whitespace)
                return text.replace(PHANTOM_SPACE, " ").encode("utf-8")
            return byte_level_decode(text)
        if attr & BYTE:
            try:
                return bytes((int(text[3:5], 16),))
            except ValueError:
                return b"\x00"      # strtol of a malformed byte token
        return b""                  # unused / undefined tokens print nothing

    def detokenize_bytes(self, ids: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """llama_detokenize, before UTF-8 decoding."""
        ids = list(ids)
        remove_space = self.flags.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        pieces = [self.token_to_piece(t, unparse_special) for t in ids]
        if remove_space and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        text = b"".join(pieces)
        return clean_spaces(text) if self.flags.clean_spaces else text

    def detokenize(self, ids: Iterable[int], remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """llama_detokenize: remove_special drops the BOS/EOS that add_special would add;
        unparse_special renders control tokens as their text. Invalid UTF-8 becomes U+FFFD."""
        return self.detokenize_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")

    def stream_decoder(self, remove_special: bool = False, unparse_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, remove_special, unparse_special)


def _cut_out(fragment: str, special: str, tid: int, lstrip: bool, rstrip: bool) -> list[str | int]:
    """Split one text fragment at every occurrence of a special token, left to right."""
    out: list[str | int] = []
    pos, end = 0, len(fragment)
    while True:
        hit = fragment.find(special, pos)
        if hit < 0:
            if pos < end:
                out.append(fragment[pos:])
            return out
        left = fragment[pos:hit]
        if lstrip:
            left = left.rstrip(_C_SPACE)
        if left:
            out.append(left)
        out.append(tid)
        pos = hit + len(special)
        if rstrip:
            while pos < end and fragment[pos] in _C_SPACE:
                pos += 1
