"""The module the ``ggflow`` entry point names: ggflow calls these hooks, each registers what it adds.

Importing this module does no work; ggflow calls the hooks when it first builds its registries.
"""
from ggflow.plugins import hookimpl

from ggflow_example_plugin.backend import ExampleNumpyBackend
from ggflow_example_plugin.iq4_nl import IQ4_NL
from ggflow_example_plugin.sampler import ArgMin

GGFLOW_API_VERSION = "3.0"  # the plugin API it was written for: ggflow refuses it under another major


@hookimpl
def register_samplers(register):
    register(ArgMin)  # the class is the factory: make_sampler("example_argmin") calls ArgMin()


@hookimpl
def register_backends(register):
    register(ExampleNumpyBackend)


@hookimpl
def register_quant_types(register):
    register(IQ4_NL)  # a GGUF format with its CPU matmul pieces (iq4_nl.py)
