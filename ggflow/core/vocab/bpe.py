"""Byte-level BPE (``tokenizer.ggml.model`` = gpt2), built on the ``tokenizers`` library.

The pre-tokenizer regexes llama.cpp uses for the file's ``tokenizer.ggml.pre`` (pretokenize.py), a
byte-level encoding, and a BPE model from the vocabulary and ``tokenizer.ggml.merges`` ranked by their
order in the file.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from ggflow.core.vocab.pretokenize import PreTokenizerSettings

if TYPE_CHECKING:
    import tokenizers

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
