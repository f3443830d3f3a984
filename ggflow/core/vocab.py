"""Tokenizers built from GGUF metadata, reproducing llama.cpp's llama-vocab.cpp token for token.

Two vocabulary types, as ``tokenizer.ggml.model`` names them:

- ``gpt2``: byte-level BPE. Built on the ``tokenizers`` library: the pre-tokenizer regexes llama.cpp
  uses for the file's ``tokenizer.ggml.pre`` (see vocab_pretokenize.py), a byte-level encoding, and a
  BPE model from the vocabulary and ``tokenizer.ggml.merges`` (ranked by their order in the file).
- ``llama``: SentencePiece-style BPE with byte fallback. llama.cpp merges the adjacent pair whose
  joined text is the vocabulary entry with the highest score (leftmost first on ties); a BPE with
  merges ranked by score cannot reproduce those ties, so that algorithm runs here, on a heap.

Around both, llama.cpp's own steps: special tokens are cut out of the text first (control and
unknown tokens only when ``parse_special``; user-defined tokens always, as llama.cpp and Hugging Face
do), BOS/EOS are added per ``add_bos``/``add_eos``, and detokenizing applies llama.cpp's piece rules,
leading-space removal and ``clean_spaces`` passes. Python strings cannot hold invalid UTF-8 but can
hold lone surrogates: ``tokenize`` replaces each with U+FFFD (what llama.cpp makes of bytes it
cannot decode), after joining well-formed surrogate pairs into the character they encode.
"""
from __future__ import annotations

import codecs
import heapq
import os
import re
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from ggflow.core.vocab_pretokenize import PreTokenizerSettings, pre_tokenizer_settings
from ggflow.errors import GGFlowError, ModelLoadError

if TYPE_CHECKING:
    import gguf
    import tokenizers


class TokenizerError(GGFlowError, ValueError):
    """Text that this vocabulary cannot tokenize (e.g. an SPM vocabulary without byte tokens)."""


class InvalidTokenError(GGFlowError, IndexError):
    """A token id outside [0, n_vocab)."""


class TokenType(IntEnum):
    """``tokenizer.ggml.token_type`` values (llama.h's llama_token_type)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(IntFlag):
    """llama.h's llama_token_attr: what llama.cpp derives from the type, plus load-time fixes."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_ATTR_OF_TYPE = np.array([TokenAttr.UNDEFINED, TokenAttr.NORMAL, TokenAttr.UNKNOWN, TokenAttr.CONTROL,
                          TokenAttr.USER_DEFINED, TokenAttr.UNUSED, TokenAttr.BYTE], dtype=np.int32)
# Plain ints: they meet numpy int32 attribute arrays.
_CONTROL, _UNUSED, _NORMAL, _BYTE = (int(TokenAttr.CONTROL), int(TokenAttr.UNUSED), int(TokenAttr.NORMAL),
                                     int(TokenAttr.BYTE))
_LSTRIP, _RSTRIP, _USER_DEFINED = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP), int(TokenAttr.USER_DEFINED)
_HIDDEN = int(TokenAttr.UNKNOWN | TokenAttr.CONTROL)   # printed only with special / unparse_special
_VERBATIM = _HIDDEN | _USER_DEFINED                    # pieces that are the token text as is
_PARTITIONED = _VERBATIM                               # cut out of the text before tokenizing

SUPPORTED_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece-style BPE with byte fallback"}

_SPACE_MARK = "\u2581"      # SentencePiece's visible space
_C_SPACE = " \t\n\v\f\r"    # C isspace() in the "C" locale: what lstrip/rstrip attributes strip

# --------------------------------------------------------------------------------------------------
# GGUF metadata
# --------------------------------------------------------------------------------------------------

_KEY = "tokenizer.ggml."
_KEPT_GENERAL_KEYS = ("general.name", "general.architecture")


def _wanted(key: str) -> bool:
    return key.startswith(_KEY) or key in _KEPT_GENERAL_KEYS


def read_tokenizer_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The tokenizer.ggml.* (and general.name/architecture) keys of a GGUF file, read from its header
    alone (ggflow.core.gguf_file: milliseconds, where gguf.GGUFReader needs seconds for a large vocab).
    Numeric arrays come back as numpy arrays, string arrays as lists of str."""
    from ggflow.core.gguf_file import GGUFFile

    return GGUFFile(path, keep=_wanted, tensors=False).fields


def _reader_metadata(reader: "gguf.GGUFReader") -> dict[str, Any]:
    """The same keys as read_tokenizer_metadata, from an already-open GGUFReader."""
    from gguf import GGUFValueType

    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not _wanted(key):
            continue
        if field.types[0] == GGUFValueType.ARRAY and field.types[-1] != GGUFValueType.STRING:
            meta[key] = _reader_numeric_array(reader, field)
        else:
            meta[key] = field.contents()
    return meta


def _reader_numeric_array(reader: "gguf.GGUFReader", field) -> np.ndarray:
    # GGUFReader keeps one view per element; the elements are contiguous in the file, so view them
    # as one array instead of concatenating 150k tiny ones.
    dtype = np.dtype(reader.gguf_scalar_to_np[field.types[-1]])
    if not field.data:
        return np.zeros(0, dtype)
    first = field.data[0]
    start = field.offset + sum(int(p.nbytes) for p in field.parts[:first])
    raw = np.asarray(reader.data[start:start + dtype.itemsize * len(field.data)]).view(dtype)
    if reader.byte_order == "S":
        raw = raw.byteswap()
    return np.array(raw)


# --------------------------------------------------------------------------------------------------
# What llama_vocab::impl::load derives from the metadata
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenizerFlags:
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool     # SPM: a space before the first text fragment; detokenize strips it again
    clean_spaces: bool         # detokenize's clean_up_tokenization_spaces passes
    ignore_merges: bool        # BPE: a pre-token that is a vocabulary entry is taken whole


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int | None
    eot: int | None
    eom: int | None
    unk: int | None
    sep: int | None
    pad: int | None
    mask: int | None
    fim_pre: int | None
    fim_suf: int | None
    fim_mid: int | None
    fim_pad: int | None
    fim_rep: int | None
    fim_sep: int | None
    eog: frozenset[int]        # every token that ends generation


# Keys read in llama.cpp's order; the deprecated prefix/suffix/middle keys override the fim_* ones.
_SPECIAL_KEYS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
                 ("eom", "eom_token_id"), ("unk", "unknown_token_id"), ("sep", "seperator_token_id"),
                 ("pad", "padding_token_id"), ("mask", "mask_token_id"),
                 ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
                 ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"),
                 ("fim_rep", "fim_rep_token_id"), ("fim_sep", "fim_sep_token_id"),
                 ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"),
                 ("fim_mid", "middle_token_id"))

_DEEPSEEK_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
# Tokens found by their text when the metadata does not name them. llama.cpp takes whichever
# candidate its hash map yields first; here the first of the list that the vocabulary has.
_FOUND_BY_TEXT = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", _DEEPSEEK_EOS, "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              _DEEPSEEK_EOS, "[e~[")
# gpt-oss: always rendered, never hidden as control tokens.
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def _load_tokens(meta: Mapping[str, Any], source: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    tokens = meta.get(_KEY + "tokens")
    if tokens is None:
        raise ModelLoadError(f"{source}: tokenizer.ggml.tokens is missing (no vocabulary in this file)")
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    n = len(tokens)
    if len(set(tokens)) != n:
        seen: set[str] = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))
        raise ModelLoadError(f"{source}: token {dup!r} appears twice in tokenizer.ggml.tokens")
    scores = _per_token_array(meta, "scores", n, np.float32, 0.0, source)
    types = _per_token_array(meta, "token_type", n, np.int32, TokenType.NORMAL, source)
    attrs = np.where((types >= 0) & (types < len(_ATTR_OF_TYPE)),
                     _ATTR_OF_TYPE[np.clip(types, 0, len(_ATTR_OF_TYPE) - 1)], 0)
    return tokens, scores, attrs.astype(np.int32)


def _per_token_array(meta: Mapping[str, Any], name: str, n: int, dtype, default, source: str) -> np.ndarray:
    value = meta.get(_KEY + name)
    if value is None:
        return np.full(n, default, dtype)
    arr = np.asarray(value)
    if len(arr) < n:
        raise ModelLoadError(f"{source}: tokenizer.ggml.{name} has {len(arr)} entries for {n} tokens")
    return arr[:n].astype(dtype)


def _load_flags(meta: Mapping[str, Any], model: str, pre: PreTokenizerSettings | None) -> TokenizerFlags:
    if model == "llama":
        add_bos, add_space_prefix, clean_spaces, ignore_merges = True, True, False, False
    else:
        add_bos, add_space_prefix = pre.add_bos, False
        clean_spaces, ignore_merges = pre.clean_spaces, pre.ignore_merges
    return TokenizerFlags(add_bos=bool(meta.get(_KEY + "add_bos_token", add_bos)),
                          add_eos=bool(meta.get(_KEY + "add_eos_token", False)),
                          add_space_prefix=bool(meta.get(_KEY + "add_space_prefix", add_space_prefix)),
                          clean_spaces=clean_spaces, ignore_merges=ignore_merges)


def _load_special_tokens(meta: Mapping[str, Any], model: str, pre: PreTokenizerSettings | None,
                         tokens: list[str], attrs: np.ndarray, token_to_id: dict[str, int]) -> SpecialTokens:
    """Special ids as llama_vocab::impl::load settles them; fixes token attributes on the way."""
    n = len(tokens)
    ids: dict[str, int | None] = {name: None for name, _ in _SPECIAL_KEYS}
    if model == "llama":
        ids.update(bos=1, eos=2, unk=0)
    else:
        ids.update(bos=None if pre.no_bos else 11, eos=11)
    for name, key in _SPECIAL_KEYS:
        if ids[name] is not None and ids[name] >= n:
            ids[name] = None                       # a default outside the vocabulary is disabled
        value = meta.get(_KEY + key)
        if value is not None and 0 <= int(value) < n:
            ids[name] = int(value)                 # an out-of-range value keeps the default

    def make_control(tid: int) -> None:
        attrs[tid] |= _CONTROL

    for name, candidates in _FOUND_BY_TEXT.items():
        if ids[name] is None:
            tid = next((token_to_id[t] for t in candidates if t in token_to_id), None)
            if tid is not None:
                ids[name] = tid
                make_control(tid)

    control = np.flatnonzero(attrs & _CONTROL)
    for tid in control:
        if "unused" in tokens[tid]:
            attrs[tid] |= _UNUSED

    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for text in _EOG_TEXTS:
        if text in token_to_id:
            eog.add(token_to_id[text])
            make_control(token_to_id[text])
    for text in _ALWAYS_RENDERED:
        if text in token_to_id:
            attrs[token_to_id[text]] = _USER_DEFINED
    eog.update(ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None)
    _drop_normal_eog_tokens(eog, tokens, attrs)
    return SpecialTokens(**ids, eog=frozenset(eog))


def _drop_normal_eog_tokens(eog: set[int], tokens: list[str], attrs: np.ndarray) -> None:
    """llama.cpp's two exceptions to "these texts end generation"."""
    by_text = {tokens[t]: t for t in eog}
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
        # o200k_harmony / solar-open: <|end|> closes a message, not the generation
        end = by_text["<|end|>"]
        eog.discard(end)
        attrs[end] = _USER_DEFINED
    if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        s = by_text["</s>"]
        eog.discard(s)
        attrs[s] = _NORMAL


def _special_token_order(tokens: list[str], attrs: np.ndarray) -> list[int]:
    """Tokens cut out of the text before tokenizing, longest (in UTF-8 bytes) first.

    llama.cpp's std::sort leaves equal lengths in an unspecified order; here they go by id.
    """
    ids = np.flatnonzero(attrs & _PARTITIONED).tolist()
    return sorted(ids, key=lambda t: (-len(tokens[t].encode("utf-8")), t))


def _apply_model_name_attrs(meta: Mapping[str, Any], attrs: np.ndarray, token_to_id: dict[str, int],
                            special_order: list[int]) -> None:
    """Per-token strip attributes llama.cpp sets by model name (they are not stored in GGUF)."""
    name = str(meta.get("general.name", "")).lower()
    pre = str(meta.get(_KEY + "pre", ""))
    arch = str(meta.get("general.architecture", ""))

    def set_attr(text: str, attr: int, on: bool) -> None:
        if text in token_to_id:
            tid = token_to_id[text]
            attrs[tid] = attrs[tid] | attr if on else attrs[tid] & ~attr

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
            any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        set_attr("<mask>", _LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for tid in special_order:
            attrs[tid] |= _RSTRIP
        set_attr("</s>", _RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, _RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", _LSTRIP, True)


# --------------------------------------------------------------------------------------------------
# The two tokenizer engines
# --------------------------------------------------------------------------------------------------

class _SpmEngine:
    """llama.cpp's llm_tokenizer_spm: merge the best-scoring adjacent pair until none is a token."""

    def __init__(self, token_to_id: dict[str, int], scores: np.ndarray):
        self.token_to_id = token_to_id
        self.scores = scores.astype(np.float64).tolist()
        self.byte_ids = [self._byte_token(token_to_id, b) for b in range(256)]

    @staticmethod
    def _byte_token(token_to_id: dict[str, int], b: int) -> int | None:
        tid = token_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = token_to_id.get(chr(b))
        return tid

    def encode(self, text: str) -> list[int]:
        """text: already space-escaped. Symbols start as code points; a merged symbol keeps the
        index of its left part, so symbol i always covers text[i:i + size[i]]."""
        n = len(text)
        if n == 0:
            return []
        token_to_id, scores = self.token_to_id, self.scores
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for i in range(n - 1):
            tid = token_to_id.get(text[i:i + 2])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)

        def push_pair(left: int, right: int) -> None:
            joined = size[left] + size[right]
            tid = token_to_id.get(text[left:left + joined])
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, joined))

        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != joined:
                continue    # one side changed since this pair was queued
            size[left], size[right] = joined, 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            if prev[left] >= 0:
                push_pair(prev[left], left)
            if after >= 0:
                push_pair(left, after)
        return self._emit(text, size, nxt)

    def _emit(self, text: str, size: list[int], nxt: list[int]) -> list[int]:
        out: list[int] = []
        i = 0
        while i != -1:
            piece = text[i:i + size[i]]
            tid = self.token_to_id.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._bytes_of(piece))
            i = nxt[i]
        return out

    def _bytes_of(self, piece: str) -> list[int]:
        ids = []
        for b in piece.encode("utf-8"):
            tid = self.byte_ids[b]
            if tid is None:
                raise TokenizerError(f"{piece!r} is not in this SentencePiece vocabulary and it has no "
                                     f"byte token <0x{b:02X}> to fall back on")
            ids.append(tid)
        return ids


def _parse_merges(merges: Iterable[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """llama.cpp's reading of "a b" merge strings: split at the first space after the first
    character; the first occurrence of a pair sets its rank (a string names exactly one pair, so
    deduplicating strings deduplicates pairs). Merges whose parts or result are not tokens are
    dropped: the tokenizers library rejects them."""
    unique = dict.fromkeys(merges)
    pairs = [(m[:cut], m[cut + 1:]) for m in unique for cut in (m.find(" ", 1),) if cut > 0]
    return [(a, b) for a, b in pairs if a in vocab and b in vocab and a + b in vocab]


def _placeholder_text(vocab: Mapping[str, int]) -> str:
    text = "\uffff<ggflow: not in the vocabulary>"
    while text in vocab:
        text += "\uffff"
    return text


def build_bpe_tokenizer(tokens: Sequence[str], merges: Iterable[str],
                        pre: PreTokenizerSettings, ignore_merges: bool) -> "tokenizers.Tokenizer":
    """A byte-level BPE ``tokenizers.Tokenizer``: pre-tokenizer regexes, byte encoding, BPE.

    It has no added tokens: special tokens are cut out before text reaches it, llama.cpp's way.
    A byte missing from the vocabulary (some vocabularies lack rare UTF-8 lead bytes) becomes the
    placeholder token with id ``len(tokens)``, which no merge touches, so it keeps its neighbours
    apart as llama.cpp's unmatched symbol does; the caller drops it, as llama.cpp drops the byte.
    """
    from tokenizers import Regex, Tokenizer, decoders, models
    from tokenizers import pre_tokenizers as pt

    vocab = {t: i for i, t in enumerate(tokens)}
    merge_pairs = _parse_merges(merges, vocab)
    placeholder = _placeholder_text(vocab)
    vocab[placeholder] = len(tokens)
    model = models.BPE(vocab=vocab, merges=merge_pairs, ignore_merges=ignore_merges,
                       unk_token=placeholder, fuse_unk=False, byte_fallback=False)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pt.Sequence(
        [pt.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pt.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


# --------------------------------------------------------------------------------------------------
# Detokenizing: pieces and llama.cpp's clean_spaces passes
# --------------------------------------------------------------------------------------------------

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


def _byte_level_decode(text: str) -> bytes:
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


# --------------------------------------------------------------------------------------------------
# Vocab
# --------------------------------------------------------------------------------------------------

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
        model = meta.get(_KEY + "model")
        if model not in SUPPORTED_MODELS:
            supported = ", ".join(f"{k!r} ({v})" for k, v in SUPPORTED_MODELS.items())
            raise ModelLoadError(f"{source}: tokenizer.ggml.model = {model!r} is not supported; "
                                 f"supported: {supported}")
        self.source, self.model = source, model
        self.pre: str | None = meta.get(_KEY + "pre")
        pre = pre_tokenizer_settings(self.pre, source) if model == "gpt2" else None
        self.pre_type = pre.pre_type if pre else "DEFAULT"
        self._tokens, self._scores, self._attrs = _load_tokens(meta, source)
        self._token_to_id = {t: i for i, t in enumerate(self._tokens)}
        self.flags = _load_flags(meta, model, pre)
        self.special = _load_special_tokens(meta, model, pre, self._tokens, self._attrs, self._token_to_id)
        self._special_order = _special_token_order(self._tokens, self._attrs)
        _apply_model_name_attrs(meta, self._attrs, self._token_to_id, self._special_order)
        self._pieces: list[bytes | None] = [None] * len(self._tokens)
        if model == "llama":
            self._spm, self.hf_tokenizer = _SpmEngine(self._token_to_id, self._scores), None
        else:
            merges = meta.get(_KEY + "merges")
            if merges is None and self.pre != "kimi-k2":
                raise ModelLoadError(f"{source}: tokenizer.ggml.merges is missing (a gpt2 BPE vocabulary needs it)")
            self._spm = None
            self.hf_tokenizer = build_bpe_tokenizer(self._tokens, merges or [], pre, self.flags.ignore_merges)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Vocab":
        """Read only the tokenizer metadata of a GGUF file (no tensors)."""
        return cls(read_tokenizer_metadata(path), str(path))

    @classmethod
    def from_gguf_reader(cls, reader: "gguf.GGUFReader") -> "Vocab":
        source = str(getattr(reader.data, "filename", None) or "<gguf>")
        return cls(_reader_metadata(reader), source)

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
        return bool(self._attrs[self._check_id(token_id)] & _CONTROL)

    def __repr__(self) -> str:
        return (f"Vocab({self.model}/{self.pre_type}, {self.n_vocab} tokens, bos={self.bos_id}, "
                f"eos={self.eos_id}, add_bos={self.add_bos})")

    # ---- text -> ids --------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize: add_special adds BOS/EOS as the vocabulary asks; parse_special lets
        control tokens written in the text become those tokens."""
        text = _well_formed(text)
        fragments = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self._required(self.bos_id, "BOS"))
        if self._spm is not None:
            self._tokenize_spm(fragments, out)
        else:
            self._tokenize_bpe(fragments, out)
        if add_special and self.add_eos:
            out.append(self._required(self.eos_id, "EOS"))
        return out

    def _required(self, tid: int | None, what: str) -> int:
        if tid is None:
            raise TokenizerError(f"{self.source}: the vocabulary asks for a {what} token but has none")
        return tid

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """tokenizer_st_partition: cut special tokens out, longest first, into token ids."""
        fragments: list[str | int] = [text]
        for tid in self._special_order:
            attr = int(self._attrs[tid])
            if not parse_special and attr & _HIDDEN:
                continue
            special = self._tokens[tid]
            if special not in text:
                continue
            lstrip, rstrip = bool(attr & _LSTRIP), bool(attr & _RSTRIP)
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
            ids = self.hf_tokenizer.encode(fragment, add_special_tokens=False).ids
            out += [i for i in ids if i != missing] if missing in ids else ids

    # ---- ids -> text --------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """llama_token_to_piece: the bytes one token stands for. Control and unknown tokens give
        their text only when ``special``; a byte token <0xNN> gives that byte."""
        tid = self._check_id(token_id)
        if not special and self._attrs[tid] & _HIDDEN:
            return b""
        piece = self._pieces[tid]
        if piece is None:
            piece = self._pieces[tid] = self._make_piece(tid)
        return piece

    def _make_piece(self, tid: int) -> bytes:
        text, attr = self._tokens[tid], int(self._attrs[tid])
        if attr & _VERBATIM:
            return text.encode("utf-8")
        if attr & _NORMAL:
            if self.model == "llama":
                return text.replace(_SPACE_MARK, " ").encode("utf-8")
            return _byte_level_decode(text)
        if attr & _BYTE:
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
