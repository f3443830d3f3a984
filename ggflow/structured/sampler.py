"""GrammarSampler: the first sampler of a constrained chain; tokens the grammar forbids get -inf.

It sees the full candidate array (nothing truncated it yet), asks llguidance for the bitmask of
allowed tokens and masks the rest; ``accept`` advances the grammar by the sampled token. Prompt
tokens are not grammar tokens: put this sampler into the chain after the prompt has been accepted
(``constrain``). Once the grammar is complete only end-of-generation tokens remain allowed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ggflow.core.sampling import SamplerBase, SamplerChain, TokenDataArray
from ggflow.errors import GrammarError

if TYPE_CHECKING:
    from ggflow.core.vocab import Vocab
    from ggflow.structured.grammar import Grammar


class GrammarSampler(SamplerBase):
    name = "grammar"

    def __init__(self, grammar: "Grammar", vocab: "Vocab"):
        self.grammar = grammar
        self.n_vocab = vocab.n_vocab
        self.matcher = grammar.matcher(vocab)

    def check_start(self) -> None:
        """Raise GrammarError if the grammar cannot produce its first token: none allowed (``a ::= a``, a
        ``$ref`` loop), or llguidance's limits hit by its forced prefix or first token (``"a"{1000000}``, a
        required recursive ``$ref``). Tried on a copy, before the request is admitted, so it is the caller's
        400 rather than a failure inside the engine step."""
        probe = self.matcher.deep_copy()
        forced = probe.compute_ff_tokens()
        if forced and not probe.is_error():
            probe.consume_tokens(forced)
        if not probe.is_error() and not probe.is_stopped():
            bits = np.unpackbits(np.frombuffer(probe.compute_bitmask(), np.uint8), bitorder="little")
            first = np.flatnonzero(bits[: self.n_vocab])
            if not probe.is_error():
                if not len(first):
                    raise GrammarError(f"the {self.grammar.source} grammar allows no first token: "
                                       "it matches no text this vocabulary can write")
                probe.consume_token(int(first[0]))
        if probe.is_error():
            raise GrammarError(f"the {self.grammar.source} grammar cannot produce its first token: "
                               f"{probe.get_error().split(chr(10))[0]}")

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens that keep the output inside the grammar."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        self._raise_if_failed()
        return np.unpackbits(bits, bitorder="little")[: self.n_vocab].view(bool)

    def apply(self, cur: TokenDataArray) -> None:
        keep = self.allowed()[cur.ids]
        cur.logits = np.where(keep, cur.logits, np.float32(-np.inf)).astype(np.float32, copy=False)
        cur.probs = None
        cur.sorted = cur.sorted and bool(keep.all())

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            self._raise_if_failed()
            raise GrammarError(f"token {token} does not continue the {self.grammar.source} grammar")

    @property
    def is_complete(self) -> bool:
        """The grammar accepts what was generated and allows nothing more (only end of generation)."""
        return self.matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    def reset(self) -> None:
        self.matcher.reset()

    def clone(self) -> "GrammarSampler":
        twin = object.__new__(GrammarSampler)
        twin.grammar, twin.n_vocab, twin.matcher = self.grammar, self.n_vocab, self.matcher.deep_copy()
        return twin

    def _raise_if_failed(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"{self.grammar.source} grammar failed: {self.matcher.get_error()}")


def constrain(chain: SamplerChain, sampler: GrammarSampler) -> SamplerChain:
    """Put the grammar first in the chain (after the prompt was accepted by the other samplers)."""
    chain.samplers.insert(0, sampler)
    return chain
