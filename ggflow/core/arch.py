"""Architecture: what an architecture plugin registers (one per family of ``general.architecture`` names)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from ggflow.core.model import HParams, Metadata
from ggflow.errors import ModelLoadError

if TYPE_CHECKING:
    from ggflow.core.backend import Backend
    from ggflow.core.graph_builder import GraphBuilder
    from ggflow.core.memory import Memory
    from ggflow.core.tensor import Tensor


class Architecture(ABC):
    names: ClassVar[tuple[str, ...]]
    # The weight record: a dataclass declared with ggflow.core.weights' tensor / optional / per_layer
    # fields. The loader checks the file against it and hands the filled record to build_graph as b.w.
    weights: ClassVar[type]
    rope_type: ClassVar[int] = -1    # ops.ROPE_NORMAL / ops.ROPE_NEOX; -1: no RoPE

    def load_hparams(self, meta: Metadata) -> HParams:
        """Read this architecture's hyperparameters from the file's metadata (by default the keys every
        llama.cpp transformer shares; override to read more, into ``HParams.extra``)."""
        return load_common_hparams(meta, rope_type=self.rope_type)

    @abstractmethod
    def build_graph(self, b: "GraphBuilder") -> "Tensor":
        """Build the forward pass for one ubatch from the builder's blocks; return logits [n_vocab, n_outputs]."""

    def create_memory(self, hp: HParams, n_ctx: int, backend: "Backend", type_k: str, type_v: str) -> "Memory":
        """The memory a Context keeps for this architecture: n_ctx cells in the backend's memory.

        The unified KV cache by default; a sliding-window or hybrid model returns its own ``Memory``."""
        from ggflow.core.kv_cache import KVCache
        return KVCache(hp, n_ctx, backend, type_k, type_v)


def load_common_hparams(meta: Metadata, rope_type: int = -1) -> HParams:
    """The keys llama.cpp reads for every transformer, with its defaults."""
    n_embd = int(meta.arch_require("embedding_length"))
    n_head = int(meta.arch_require("attention.head_count"))
    if n_head <= 0 or n_embd % n_head:
        raise ModelLoadError(f"{meta.path}: embedding_length {n_embd} is not a multiple of head_count {n_head}")
    n_head_kv = int(meta.arch_get("attention.head_count_kv", n_head))
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise ModelLoadError(f"{meta.path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    head_k = int(meta.arch_get("attention.key_length", n_embd // n_head))
    head_v = int(meta.arch_get("attention.value_length", n_embd // n_head))
    tokens = meta.get("tokenizer.ggml.tokens")
    n_vocab = int(meta.arch_get("vocab_size", len(tokens) if tokens is not None else 0))
    scale = 1.0
    if meta.arch_get("rope.scaling.type", "none") == "linear":
        scale = 1.0 / float(meta.arch_get("rope.scaling.factor", 1.0) or 1.0)
    hp = HParams(
        n_vocab=n_vocab,
        n_ctx_train=int(meta.arch_get("context_length", 2048)),
        n_embd=n_embd,
        n_layer=int(meta.arch_require("block_count")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=int(meta.arch_get("feed_forward_length", 4 * n_embd)),
        n_embd_head_k=head_k,
        n_embd_head_v=head_v,
        n_rot=int(meta.arch_get("rope.dimension_count", head_k)) if rope_type >= 0 else 0,
        rope_type=rope_type,
        rope_freq_base=float(meta.arch_get("rope.freq_base", 10000.0)),
        rope_freq_scale=scale,
        norm_eps=float(meta.arch_get("attention.layer_norm_epsilon", 1e-5)),
        norm_rms_eps=float(meta.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
    )
    if hp.n_vocab <= 0:
        raise ModelLoadError(f"{meta.path}: vocabulary size unknown (no {meta.arch}.vocab_size, no tokens)")
    return hp
