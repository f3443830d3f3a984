"""Errors a user can cause. Each says what was wrong and, where it helps, what to do."""
from __future__ import annotations


class GGFlowError(Exception):
    """Base of every error ggflow raises on purpose."""


class UnknownNameError(GGFlowError, KeyError):
    """A name (op, type, backend, sampler, architecture) that no plugin provides."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"unknown {kind} {name!r}; registered: {', '.join(self.known) or '(none)'}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


class ShapeError(GGFlowError, ValueError):
    """An op was built on tensors whose shapes or types it cannot combine."""


class PluginError(GGFlowError):
    """A plugin failed to load or raised inside one of its hooks."""


class BackendError(GGFlowError):
    """A backend is unavailable or cannot run what it was asked to."""


class QuantizationError(GGFlowError, ValueError):
    """Data that cannot be quantized or dequantized as asked (e.g. a row not a multiple of the block)."""


class ImatrixError(GGFlowError, ValueError):
    """An importance-matrix file that can't be read, or one that doesn't fit the model it is used with."""


class ModelLoadError(GGFlowError):
    """A GGUF file that is truncated, malformed, or describes a model ggflow cannot build."""


class ChatTemplateError(GGFlowError):
    """A chat template that does not parse, or that raised while rendering (its own message is kept)."""


class ArgumentError(GGFlowError, ValueError):
    """A public argument with a value the call cannot take. Names the argument, the value and what is accepted."""

    def __init__(self, name: str, value: object, accepted: str):
        self.name, self.value, self.accepted = name, value, accepted
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{name}={shown} is not accepted: {name} must be {accepted}")


class ContextMemoryError(GGFlowError, MemoryError):
    """The KV cache and compute buffers a context size needs do not fit in the memory available."""


class ContextFullError(GGFlowError, ValueError):
    """The tokens to evaluate do not fit in the context (a prompt longer than n_ctx)."""


class GrammarError(GGFlowError, ValueError):
    """A grammar, JSON schema or regex that does not compile, or output that cannot continue it."""


class AdapterError(ModelLoadError):
    """A LoRA adapter file that is corrupt, not a LoRA adapter, or made for another base model."""
