"""The tokenizer fields of a converted model, as llama.cpp's converter writes them.

``tokenizers`` reads ``tokenizer.json`` (the Hugging Face tokenizer itself, without transformers): the
vocabulary in id order, which tokens are added and special (CONTROL) or added and plain (USER_DEFINED),
and, by encoding llama.cpp's check text, which pre-tokenizer a BPE vocabulary uses (pre_hashes.py).
Special token ids and the add_bos/add_eos flags come from gguf-py's ``SpecialVocab``, the code llama.cpp's
converter calls for them, so both tools write the same keys.
"""
from __future__ import annotations

from hashlib import sha256
from typing import Any

from ggflow.convert.pre_hashes import CHECK_TEXT, PRE_BY_DIGEST
from ggflow.convert.source import HFModel
from ggflow.convert.writer import ConvertError

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5   # gguf.TokenType


def load_hf_tokenizer(model: HFModel):
    """The model's ``tokenizers.Tokenizer``; a ConvertError when it has no tokenizer.json."""
    from tokenizers import Tokenizer

    path = model.file("tokenizer.json")
    if path is None:
        raise ConvertError(f"{model.path}: no tokenizer.json (the converter needs the Hugging Face tokenizer "
                           f"files next to config.json)")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()      # some files pad every encoding (MiniLM's to 128): the ids alone are wanted
    tokenizer.no_truncation()
    return tokenizer


def normalizer_flags(model: HFModel) -> dict[str, bool]:
    """tokenizer.ggml.normalizer.lowercase / .strip_accents from tokenizer.json's normalizer, where it says
    (a Lowercase or StripAccents step, a BertNormalizer's settings, inside a Sequence too)."""
    flags: dict[str, bool] = {}

    def visit(norm: dict) -> None:
        kind = norm.get("type")
        if kind == "Lowercase":
            flags["lowercase"] = True
        elif kind == "StripAccents":
            flags["strip_accents"] = True
        elif kind == "BertNormalizer":
            for key in ("lowercase", "strip_accents"):
                if norm.get(key) is not None:
                    flags[key] = bool(norm[key])
        elif kind == "Sequence":
            for inner in norm.get("normalizers", []):
                visit(inner)

    visit((model.json("tokenizer.json") or {}).get("normalizer") or {})
    return flags


def vocab_base(model: HFModel, tokenizer) -> tuple[list[str], list[int]]:
    """Tokens in id order with their GGUF token types (get_vocab_base's rules): ids the tokenizer lacks
    become "[PAD{i}]" (UNUSED), added special tokens CONTROL, other added tokens USER_DEFINED."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    added = tokenizer.get_added_tokens_decoder()
    size = max(int(model.config.get("vocab_size") or 0), max(vocab.values()) + 1)
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        tokens.append(by_id[i])
        types.append((CONTROL if added[i].special else USER_DEFINED) if i in added else NORMAL)
    return tokens, types


def pre_tokenizer_name(model: HFModel, tokenizer) -> str:
    """tokenizer.ggml.pre, as llama.cpp's converter names it from the check text's token ids."""
    digest = sha256(str(tokenizer.encode(CHECK_TEXT).ids).encode()).hexdigest()
    name = PRE_BY_DIGEST.get(digest)
    if name is None:
        raise ConvertError(f"{model.path}: this BPE tokenizer's pre-tokenizer is not one llama.cpp knows "
                           f"(check digest {digest}); its GGUF would tokenize differently")
    return name


def add_special_tokens(writer: Any, model: HFModel, n_vocab: int, merges: bool) -> None:
    import logging

    import gguf

    logging.getLogger("gguf.vocab").setLevel(logging.ERROR)   # its notes on token types it has no key for
    gguf.SpecialVocab(model.path, load_merges=merges, n_vocab=n_vocab).add_to_gguf(writer, quiet=True)


def add_wordpiece_vocab(writer: Any, model: HFModel) -> int:
    """BERT's vocabulary with llama.cpp's phantom spaces: "\u2581word" for a word start, "piece" for a
    "##piece" continuation, control tokens as they are. Returns the vocabulary's size."""
    tokenizer = load_hf_tokenizer(model)
    tokens, types = vocab_base(model, tokenizer)
    tokens = [t if kind == CONTROL else t[2:] if t.startswith("##") else "\u2581" + t
              for t, kind in zip(tokens, types)]
    writer.add_token_type_count(int(model.config.get("type_vocab_size", 1)))
    writer.add_tokenizer_model("bert")
    digest = sha256(str(tokenizer.encode(CHECK_TEXT).ids).encode()).hexdigest()
    writer.add_tokenizer_pre(PRE_BY_DIGEST.get(digest, "default"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    add_special_tokens(writer, model, len(tokens), merges=False)
    for key, value in normalizer_flags(model).items():
        writer.add_bool(f"tokenizer.ggml.normalizer.{key}", value)
    return len(tokens)


def add_bpe_vocab(writer: Any, model: HFModel) -> int:
    """A byte-level BPE vocabulary (gpt2, llama 3, qwen): tokens, types, merges, the pre-tokenizer's name."""
    tokenizer = load_hf_tokenizer(model)
    tokens, types = vocab_base(model, tokenizer)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(model, tokenizer))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    add_special_tokens(writer, model, len(tokens), merges=True)
    return len(tokens)
