"""The module the ``ggflow`` entry point names. Importing it does no work; ggflow calls the hook."""
from ggflow.plugins.hookspecs import hookimpl

from ggflow_gemma3.gemma3 import Gemma3


@hookimpl
def register_architectures(register):
    register(Gemma3())
