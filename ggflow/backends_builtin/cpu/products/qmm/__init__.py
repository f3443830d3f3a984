"""The quantized matmul skeleton (``template``) and what it is built from: each weight family's pieces
(``legacy``, ``kquants``, ``mxfp4``, float types in ``floats``), the activation quantizers (``act``), the
repacked row-tile layout (``layout``), and the integer dot-product kernels it calls: int16 pairs
(``pairs``, ``token_sums``), byte quads (``quads``), AMX tiles (``amx``), with ``groups`` for several weights
of one input and ``prefetch`` / ``int16`` as LLVM-level helpers.
"""
