"""The module the ``ggflow`` entry point names. Importing it does no work; ggflow calls the hook."""
from ggflow.plugins.hookspecs import hookimpl

from ggflow_gemma3.gemma3 import Gemma3

GGFLOW_API_VERSION = "3.0"  # the plugin API it was written for: ggflow refuses it under another major


@hookimpl
def register_architectures(register):
    register(Gemma3())
