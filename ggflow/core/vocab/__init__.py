"""Tokenizers built from GGUF metadata, reproducing llama.cpp's llama-vocab.cpp token for token.

Two vocabulary types, as ``tokenizer.ggml.model`` names them:

- ``gpt2``: byte-level BPE on the ``tokenizers`` library (bpe.py), with the pre-tokenizer regexes
  llama.cpp uses for the file's ``tokenizer.ggml.pre`` (pretokenize.py).
- ``llama``: SentencePiece-style BPE with byte fallback, llama.cpp's score-ordered merging (spm.py).

One idea per module:

- load.py: reading the tokenizer.ggml.* keys and what llama.cpp derives from them (flags, special tokens);
- attrs.py: token types and attributes; errors.py: what a user can do wrong;
- spm.py, bpe.py, pretokenize.py: text -> ids;
- detokenize.py: ids -> text (byte-level pieces, clean_spaces, the streaming decoder);
- vocab.py: ``Vocab``, which puts them together behind llama.cpp's tokenize / detokenize / token_to_piece.
"""
from ggflow.core.vocab.attrs import TokenAttr, TokenType
from ggflow.core.vocab.bpe import build_bpe_tokenizer
from ggflow.core.vocab.detokenize import StreamDecoder, _StreamingCleaner, clean_spaces
from ggflow.core.vocab.errors import InvalidTokenError, TokenizerError
from ggflow.core.vocab.load import SUPPORTED_MODELS, SpecialTokens, TokenizerFlags, read_tokenizer_metadata
from ggflow.core.vocab.vocab import Vocab

__all__ = ["Vocab", "StreamDecoder", "TokenAttr", "TokenType", "TokenizerError", "InvalidTokenError",
           "TokenizerFlags", "SpecialTokens", "SUPPORTED_MODELS", "read_tokenizer_metadata",
           "build_bpe_tokenizer", "clean_spaces"]
