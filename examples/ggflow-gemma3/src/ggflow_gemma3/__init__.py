"""ggflow-gemma3: the ``gemma3`` architecture as a ggflow plugin, built from ggflow's generic blocks."""
