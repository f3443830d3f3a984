"""qwen2: llama's block and weights (Q/K/V biases, which every qwen2 file has) with NEOX-mode RoPE."""
from __future__ import annotations

from ggflow.core import ops
from ggflow.arch_builtin.llama import Llama
from ggflow.plugins.hookspecs import hookimpl


class Qwen2(Llama):
    names = ("qwen2",)
    rope_type = ops.ROPE_NEOX


@hookimpl
def register_architectures(register):
    register(Qwen2())
