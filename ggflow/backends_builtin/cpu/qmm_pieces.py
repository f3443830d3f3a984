"""Moved: the CPU pieces contract a quant type implements is ``ggflow.plugins.cpu_pieces`` (plugin API 3.0)."""
from ggflow.plugins.removed import RemovedNameError

raise RemovedNameError("ggflow.backends_builtin.cpu.qmm_pieces was moved in ggflow's plugin API 3.0: import "
                       "BlockPieces and its helpers from ggflow.plugins.cpu_pieces")
