"""Importance matrices (llama-imatrix): per weight, the squared input activations summed over a text.

``compute_imatrix`` runs a model and collects them through the scheduler's observer hook
(collector.py); ``read_imatrix`` reads llama.cpp's GGUF and legacy .dat files, ``write_gguf`` /
``write_dat`` write them (files.py). ``ggflow quantize --imatrix FILE`` passes them to the quantizers.
"""
from ggflow.imatrix.collector import Collector, Entry
from ggflow.imatrix.compute import compute_imatrix
from ggflow.imatrix.files import Imatrix, read_imatrix, write_dat, write_gguf

__all__ = ["Collector", "Entry", "Imatrix", "compute_imatrix", "read_imatrix", "write_dat", "write_gguf"]
