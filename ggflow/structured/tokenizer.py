"""ggflow's Vocab as llguidance's tokenizer: every token's bytes, which are special, and how to tokenize.

llguidance needs the exact bytes each token stands for (so it can tell which tokens extend a partial
match) and a tokenizer for the text it forces. Special tokens are marked as llguidance expects
(a 0xFF byte before their text), so a grammar cannot produce ``<|im_end|>`` by spelling it out.
Building one walks the whole vocabulary (~0.2 s at 49k tokens), so it is made once per Vocab.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from ggflow.errors import GGFlowError

if TYPE_CHECKING:
    import llguidance

    from ggflow.core.vocab import Vocab

_SPECIAL_MARK = b"\xff"
_cache: "weakref.WeakKeyDictionary[Vocab, llguidance.LLTokenizer]" = weakref.WeakKeyDictionary()


def require_llguidance():
    try:
        import llguidance
    except ImportError:
        raise GGFlowError("grammars and JSON schemas need llguidance: pip install 'ggflow[grammar]'") from None
    return llguidance


class _VocabAdapter:
    """The duck-typed tokenizer llguidance's TokenizerWrapper reads (eos/bos ids, token bytes, a call)."""

    def __init__(self, vocab: "Vocab"):
        from ggflow.core.vocab import TokenAttr

        self._vocab = vocab
        special = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for tid in range(vocab.n_vocab):
            piece = vocab.token_to_piece(tid, special=True)
            if vocab.token_attr(tid) & special or vocab.is_eog(tid):
                self.special_token_ids.append(tid)
                piece = _SPECIAL_MARK + piece
            self.tokens.append(piece)
        self.eos_token_id = vocab.eot_id if vocab.eot_id is not None else vocab.eos_id
        self.bos_token_id = vocab.bos_id

    def __call__(self, text: "str | bytes") -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._vocab.tokenize(text, add_special=False, parse_special=False)


def lltokenizer(vocab: "Vocab") -> "llguidance.LLTokenizer":
    """The llguidance tokenizer for a vocabulary, built on first use and cached while the Vocab lives."""
    tok = _cache.get(vocab)
    if tok is None:
        llg = require_llguidance()
        adapter = _VocabAdapter(vocab)
        eog = sorted({t for t in (vocab.eos_id, vocab.eot_id) if t is not None})
        tok = llg.LLTokenizer(llg.TokenizerWrapper(adapter), n_vocab=vocab.n_vocab, eos_token=eog or None)
        _cache[vocab] = tok
    return tok
