"""WordPiece (``tokenizer.ggml.model`` = bert), built on the ``tokenizers`` library.

llama.cpp's converter stores a BERT vocabulary with "phantom spaces": a word-initial piece "foo" as
"\u2581foo", a continuation "##bar" as "bar", control tokens ([CLS], [SEP], ...) as they are. Here that is
undone and the ``tokenizers`` library's BERT pipeline runs on the result: the BertNormalizer (control
characters dropped, CJK ideographs set apart, lowercasing and accent stripping as
``tokenizer.ggml.normalizer.lowercase`` / ``.strip_accents`` say, both true by default as in llama.cpp),
the BertPreTokenizer (whitespace and punctuation) and greedy longest-match WordPiece, which is the
Hugging Face tokenizer these models were trained with (llama.cpp's WPM session is the same algorithm).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ggflow.core.vocab.attrs import CONTROL

if TYPE_CHECKING:
    import tokenizers

PHANTOM_SPACE = "\u2581"
MAX_WORD_CHARS = 100   # BERT's max_input_chars_per_word: a longer word is [UNK], as in Hugging Face


def hf_wordpiece_token(token: str, attr: int) -> str:
    """A GGUF (phantom-space) token as the Hugging Face vocabulary spells it."""
    if attr & CONTROL:
        return token
    if token.startswith(PHANTOM_SPACE):
        return token[len(PHANTOM_SPACE):]
    return "##" + token


def build_wpm_tokenizer(tokens: Sequence[str], attrs: np.ndarray, unk_id: int | None, lowercase: bool,
                        strip_accents: bool) -> "tokenizers.Tokenizer":
    """A ``tokenizers.Tokenizer`` for the vocabulary; ids are the GGUF's. No added tokens: special tokens
    are cut out before text reaches it, as for the other vocabularies."""
    from tokenizers import Tokenizer, models, normalizers
    from tokenizers import pre_tokenizers as pt

    vocab: dict[str, int] = {}
    for i, (tok, attr) in enumerate(zip(tokens, attrs)):
        vocab.setdefault(hf_wordpiece_token(tok, int(attr)), i)   # the first spelling wins, as a dict in HF
    unk = tokens[unk_id] if unk_id is not None else "[UNK]"
    if unk not in vocab:
        vocab[unk] = len(tokens)   # a vocabulary without [UNK]: the caller drops this placeholder id
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=MAX_WORD_CHARS))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=strip_accents, lowercase=lowercase)
    tokenizer.pre_tokenizer = pt.BertPreTokenizer()
    return tokenizer
