"""What a user can do wrong with a vocabulary."""
from __future__ import annotations

from ggflow.errors import GGFlowError


class TokenizerError(GGFlowError, ValueError):
    """Text that this vocabulary cannot tokenize (e.g. an SPM vocabulary without byte tokens)."""


class InvalidTokenError(GGFlowError, IndexError):
    """A token id outside [0, n_vocab)."""
