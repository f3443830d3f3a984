"""ggflow: run GGUF language models in Python, built the way ggml/llama.cpp is, with plugin seams."""
from ggflow import _numba_setup  # noqa: F401  (first: where numba caches, set before numba loads)
from ggflow.core.quants import dequantize, quantize

__version__ = "0.1.0"
__all__ = ["quantize", "dequantize", "__version__"]
