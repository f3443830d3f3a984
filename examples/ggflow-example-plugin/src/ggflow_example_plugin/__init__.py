"""An example ggflow plugin: a sampler and a backend, registered through ggflow's hooks."""
from ggflow_example_plugin.backend import ExampleNumpyBackend
from ggflow_example_plugin.sampler import ArgMin

__all__ = ["ArgMin", "ExampleNumpyBackend"]
