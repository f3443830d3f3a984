"""Token types as GGUF stores them and the attributes llama.cpp derives from them (llama.h)."""
from __future__ import annotations

from enum import IntEnum, IntFlag

import numpy as np

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


ATTR_OF_TYPE = np.array([TokenAttr.UNDEFINED, TokenAttr.NORMAL, TokenAttr.UNKNOWN, TokenAttr.CONTROL,
                         TokenAttr.USER_DEFINED, TokenAttr.UNUSED, TokenAttr.BYTE], dtype=np.int32)
# Plain ints: they meet numpy int32 attribute arrays.
CONTROL, UNUSED, NORMAL, BYTE = (int(TokenAttr.CONTROL), int(TokenAttr.UNUSED), int(TokenAttr.NORMAL),
                                 int(TokenAttr.BYTE))
LSTRIP, RSTRIP, USER_DEFINED = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP), int(TokenAttr.USER_DEFINED)
HIDDEN = int(TokenAttr.UNKNOWN | TokenAttr.CONTROL)    # printed only with special / unparse_special
VERBATIM = HIDDEN | USER_DEFINED                       # pieces that are the token text as is
PARTITIONED = VERBATIM                                 # cut out of the text before tokenizing
