"""What llama_vocab::impl::load reads from a GGUF file's tokenizer.ggml.* keys and derives from them:
the tokens with their scores and attributes, the tokenizer flags, the special tokens (found by key, by
model defaults or by their text), and the per-model attribute fixes llama.cpp hard-codes by name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ggflow.core.metadata import Metadata
from ggflow.core.vocab.attrs import (ATTR_OF_TYPE, CONTROL, LSTRIP, NORMAL, PARTITIONED, RSTRIP, UNUSED,
                                     USER_DEFINED, TokenType)
from ggflow.core.vocab.pretokenize import PreTokenizerSettings, pre_tokenizer_settings
from ggflow.errors import ModelLoadError

if TYPE_CHECKING:
    import gguf

SUPPORTED_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece-style BPE with byte fallback",
                    "bert": "WordPiece (BERT's phantom-space vocabulary)"}

# --------------------------------------------------------------------------------------------------
# GGUF metadata
# --------------------------------------------------------------------------------------------------

KEY = "tokenizer.ggml."   # the prefix of every tokenizer key
_KEPT_GENERAL_KEYS = ("general.name", "general.architecture")


def _wanted(key: str) -> bool:
    return key.startswith(KEY) or key in _KEPT_GENERAL_KEYS


def read_tokenizer_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The tokenizer.ggml.* (and general.name/architecture) keys of a GGUF file, read from its header
    alone (ggflow.core.gguf_file: milliseconds, where gguf.GGUFReader needs seconds for a large vocab).
    Numeric arrays come back as numpy arrays, string arrays as lists of str."""
    from ggflow.core.gguf_file import GGUFFile

    return GGUFFile(path, keep=_wanted, tensors=False).fields


def reader_metadata(reader: "gguf.GGUFReader") -> dict[str, Any]:
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
    add_sep: bool = False      # WordPiece: [SEP] after the text (BERT's "[CLS] text [SEP]")
    lowercase: bool = True     # WordPiece's BertNormalizer (tokenizer.ggml.normalizer.lowercase)
    strip_accents: bool = True # (tokenizer.ggml.normalizer.strip_accents; by default as lowercase)


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
_SPECIALKEYS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
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


def _load_tokens(meta: Metadata, source: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    tokens = meta.get_array(KEY + "tokens", "str", None)
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
    attrs = np.where((types >= 0) & (types < len(ATTR_OF_TYPE)),
                     ATTR_OF_TYPE[np.clip(types, 0, len(ATTR_OF_TYPE) - 1)], 0)
    return tokens, scores, attrs.astype(np.int32)


def _per_token_array(meta: Metadata, name: str, n: int, dtype, default, source: str) -> np.ndarray:
    elem = "float" if np.dtype(dtype).kind == "f" else "int"
    arr = meta.get_array(KEY + name, elem, None)
    if arr is None:
        return np.full(n, default, dtype)
    if len(arr) < n:   # llama.cpp: "Index out of array bounds for scores"
        raise ModelLoadError(f"{source}: tokenizer.ggml.{name} has {len(arr)} entries for {n} tokens")
    return arr[:n].astype(dtype)


def _load_flags(meta: Metadata, model: str, pre: PreTokenizerSettings | None) -> TokenizerFlags:
    if model == "llama":
        add_bos, add_space_prefix, clean_spaces, ignore_merges = True, True, False, False
    elif model == "bert":
        # llama.cpp's WPM tokenizer adds [CLS] ... [SEP] with add_special whatever add_bos/eos/sep say
        lowercase = meta.get_bool(KEY + "normalizer.lowercase", True)
        return TokenizerFlags(add_bos=True, add_eos=False, add_space_prefix=False, clean_spaces=True,
                              ignore_merges=False, add_sep=True, lowercase=lowercase,
                              strip_accents=meta.get_bool(KEY + "normalizer.strip_accents", lowercase))
    else:
        add_bos, add_space_prefix = pre.add_bos, False
        clean_spaces, ignore_merges = pre.clean_spaces, pre.ignore_merges
    return TokenizerFlags(add_bos=meta.get_bool(KEY + "add_bos_token", add_bos),
                          add_eos=meta.get_bool(KEY + "add_eos_token", False),
                          add_space_prefix=meta.get_bool(KEY + "add_space_prefix", add_space_prefix),
                          clean_spaces=clean_spaces, ignore_merges=ignore_merges)


def _load_special_tokens(meta: Metadata, model: str, pre: PreTokenizerSettings | None,
                         tokens: list[str], attrs: np.ndarray, token_to_id: dict[str, int]) -> SpecialTokens:
    """Special ids as llama_vocab::impl::load settles them; fixes token attributes on the way."""
    n = len(tokens)
    ids: dict[str, int | None] = {name: None for name, _ in _SPECIALKEYS}
    if model == "llama":
        ids.update(bos=1, eos=2, unk=0)
    elif model == "bert":   # llama.cpp's WPM defaults: [CLS] 101 as BOS, [UNK] 100, [SEP] 102, [PAD] 0, [MASK] 103
        ids.update(bos=101, unk=100, sep=102, pad=0, mask=103)
    else:
        ids.update(bos=None if pre.no_bos else 11, eos=11)
    for name, key in _SPECIALKEYS:
        if ids[name] is not None and ids[name] >= n:
            ids[name] = None                       # a default outside the vocabulary is disabled
        value = meta.get_int(KEY + key, None)     # not an integer: refused, as llama.cpp's get_key does
        if value is not None and 0 <= value < n:
            ids[name] = value                      # an out-of-range value keeps the default

    def make_control(tid: int) -> None:
        attrs[tid] |= CONTROL

    for name, candidates in _FOUND_BY_TEXT.items():
        if ids[name] is None:
            tid = next((token_to_id[t] for t in candidates if t in token_to_id), None)
            if tid is not None:
                ids[name] = tid
                make_control(tid)

    control = np.flatnonzero(attrs & CONTROL)
    for tid in control:
        if "unused" in tokens[tid]:
            attrs[tid] |= UNUSED

    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for text in _EOG_TEXTS:
        if text in token_to_id:
            eog.add(token_to_id[text])
            make_control(token_to_id[text])
    for text in _ALWAYS_RENDERED:
        if text in token_to_id:
            attrs[token_to_id[text]] = USER_DEFINED
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
        attrs[end] = USER_DEFINED
    if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        s = by_text["</s>"]
        eog.discard(s)
        attrs[s] = NORMAL


def _special_token_order(tokens: list[str], attrs: np.ndarray) -> list[int]:
    """Tokens cut out of the text before tokenizing, longest (in UTF-8 bytes) first.

    llama.cpp's std::sort leaves equal lengths in an unspecified order; here they go by id.
    """
    ids = np.flatnonzero(attrs & PARTITIONED).tolist()
    return sorted(ids, key=lambda t: (-len(tokens[t].encode("utf-8")), t))


def _apply_model_name_attrs(meta: Metadata, attrs: np.ndarray, token_to_id: dict[str, int],
                            special_order: list[int]) -> None:
    """Per-token strip attributes llama.cpp sets by model name (they are not stored in GGUF)."""
    name = meta.get_str("general.name", "").lower()
    pre = meta.get_str(KEY + "pre", "")
    arch = meta.arch

    def set_attr(text: str, attr: int, on: bool) -> None:
        if text in token_to_id:
            tid = token_to_id[text]
            attrs[tid] = attrs[tid] | attr if on else attrs[tid] & ~attr

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
            any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        set_attr("<mask>", LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for tid in special_order:
            attrs[tid] |= RSTRIP
        set_attr("</s>", RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", LSTRIP, True)


# --------------------------------------------------------------------------------------------------
# All of it, for Vocab
# --------------------------------------------------------------------------------------------------

@dataclass
class LoadedVocab:
    model: str                                  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str | None                             # tokenizer.ggml.pre
    pre_settings: PreTokenizerSettings | None   # gpt2 only
    tokens: list[str]
    scores: np.ndarray                          # float32, per token
    attrs: np.ndarray                           # int32 TokenAttr bits, per token
    token_to_id: dict[str, int]
    flags: TokenizerFlags
    special: SpecialTokens
    special_order: list[int]                    # the tokens cut out of the text first, in cutting order
    merges: list[str] | None                    # gpt2 only


def load_vocab(meta: Mapping[str, Any], source: str) -> LoadedVocab:
    """Everything llama_vocab::impl::load settles; a ModelLoadError naming ``source`` for what it refuses
    (every key is read through Metadata's typed accessors: a value of the wrong type is refused by name)."""
    meta = Metadata.of(meta, source)
    model = meta.get_str(KEY + "model", None)
    if model not in SUPPORTED_MODELS:
        supported = ", ".join(f"{k!r} ({v})" for k, v in SUPPORTED_MODELS.items())
        raise ModelLoadError(f"{source}: tokenizer.ggml.model = {model!r} is not supported; "
                             f"supported: {supported}")
    pre_name: str | None = meta.get_str(KEY + "pre", None)
    pre = pre_tokenizer_settings(pre_name, source) if model == "gpt2" else None
    tokens, scores, attrs = _load_tokens(meta, source)
    token_to_id = {t: i for i, t in enumerate(tokens)}
    flags = _load_flags(meta, model, pre)
    special = _load_special_tokens(meta, model, pre, tokens, attrs, token_to_id)
    special_order = _special_token_order(tokens, attrs)
    _apply_model_name_attrs(meta, attrs, token_to_id, special_order)
    merges = None
    if model == "gpt2":
        merges = meta.get_array(KEY + "merges", "str", None)
        if merges is None and pre_name != "kimi-k2":
            raise ModelLoadError(f"{source}: tokenizer.ggml.merges is missing (a gpt2 BPE vocabulary needs it)")
        merges = list(merges or [])
    return LoadedVocab(model, pre_name, pre, tokens, scores, attrs, token_to_id, flags, special, special_order,
                       merges)
