"""ggflow: run GGUF language models in Python, built the way ggml/llama.cpp is, with plugin seams."""
from ggflow.core.quants import dequantize, quantize

__version__ = "0.1.0"
__all__ = ["quantize", "dequantize", "__version__"]
