"""Architecture: what an architecture plugin registers (one per family of ``general.architecture`` names)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from ggflow.core.hparams import HParams
from ggflow.core.metadata import Metadata
from ggflow.errors import ModelLoadError
from ggflow.plugins.removed import removed_names

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
    norm_eps_key: ClassVar[str] = "attention.layer_norm_rms_epsilon"   # the (required) epsilon it norms with

    def load_hparams(self, meta: Metadata) -> HParams:
        """Read this architecture's hyperparameters from the file's metadata (by default the keys every
        llama.cpp transformer shares; override to read more, into ``HParams.extra``)."""
        return load_common_hparams(meta, rope_type=self.rope_type, norm_eps_key=self.norm_eps_key)

    @abstractmethod
    def build_graph(self, b: "GraphBuilder") -> "Tensor":
        """Build the forward pass for one ubatch from the builder's blocks; return logits [n_vocab, n_outputs]."""

    def create_memory(self, hp: HParams, n_ctx: int, backend: "Backend", type_k: str, type_v: str,
                      n_ubatch: int) -> "Memory":
        """The memory a Context keeps for this architecture: n_ctx cells in the backend's memory, written
        n_ubatch tokens at most at a time (what a window-sized cache must hold beyond the window).

        The unified KV cache by default; a sliding-window model returns ``kv_cache_iswa.IswaCache``, a
        hybrid one its own ``Memory``."""
        from ggflow.core.kv_cache import KVCache
        return KVCache(hp, n_ctx, backend, type_k, type_v)

    def kv_cells(self, hp: HParams, n_ctx: int, n_ubatch: int) -> list[int]:
        """How many cells of K and V each layer's memory keeps for a context of n_ctx: what the memory
        estimate counts before anything is allocated (``api.memory_estimate``). Every layer n_ctx by
        default; an architecture whose ``create_memory`` keeps fewer for some layers says so here."""
        return [n_ctx] * hp.n_layer


MAX_LAYERS = 512              # LLAMA_MAX_LAYERS: llama.cpp asserts 0 < block_count <= 512
INT32_MAX = 2**31 - 1         # ggml passes n_ctx_orig and sizes as int32
RMS_EPS, LAYER_EPS = "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"


def load_common_hparams(meta: Metadata, rope_type: int = -1, norm_eps_key: str = RMS_EPS) -> HParams:
    """The keys llama.cpp's load_hparams reads for every transformer, each checked for type and range.

    Required as llama.cpp requires them (get_key without a default): context_length, embedding_length,
    block_count, the norm epsilon the architecture uses (``norm_eps_key``); head_count and
    feed_forward_length too, which llama.cpp defaults to 0 and then refuses at the first tensor's shape.
    """
    key, get_int, get_float = meta.arch_key, meta.get_int, meta.get_float
    n_embd = get_int(key("embedding_length"), min=1, max=INT32_MAX)
    n_head = get_int(key("attention.head_count"), min=1, max=n_embd)
    if n_embd % n_head:
        raise ModelLoadError(f"{meta.path}: embedding_length {n_embd} is not a multiple of head_count {n_head}")
    n_head_kv = get_int(key("attention.head_count_kv"), n_head, min=1, max=n_head)
    if n_head % n_head_kv:
        raise ModelLoadError(f"{meta.path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    head_k = get_int(key("attention.key_length"), n_embd // n_head, min=1, max=INT32_MAX // n_head)
    head_v = get_int(key("attention.value_length"), n_embd // n_head, min=1, max=INT32_MAX // n_head)
    n_rot = 0
    if rope_type >= 0:
        n_rot = get_int(key("rope.dimension_count"), head_k, min=2, max=head_k)
        if n_rot % 2:
            raise ModelLoadError(f"{meta.path}: {key('rope.dimension_count')} = {n_rot} is odd (RoPE rotates pairs)")
    scale = 1.0
    if meta.get_str(key("rope.scaling.type"), "none") == "linear":
        factor = get_float(key("rope.scaling.factor"), 0.0, min=0.0)
        scale = 1.0 / factor if factor else 1.0
    eps = {k: get_float(key(k), 1e-5, min=0.0) for k in (RMS_EPS, LAYER_EPS)}
    eps[norm_eps_key] = get_float(key(norm_eps_key), min=0.0)   # the one this architecture normalizes with
    freq_base = get_float(key("rope.freq_base"), 10000.0)
    if freq_base <= 0:
        raise ModelLoadError(f"{meta.path}: {key('rope.freq_base')} = {freq_base} must be positive")
    return HParams(
        n_vocab=_n_vocab(meta),
        n_ctx_train=get_int(key("context_length"), min=1, max=INT32_MAX),
        n_embd=n_embd,
        n_layer=get_int(key("block_count"), min=1, max=MAX_LAYERS),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=get_int(key("feed_forward_length"), min=1, max=INT32_MAX),
        n_embd_head_k=head_k,
        n_embd_head_v=head_v,
        n_rot=n_rot,
        rope_type=rope_type,
        rope_freq_base=freq_base,
        rope_freq_scale=scale,
        norm_eps=eps[LAYER_EPS],
        norm_rms_eps=eps[RMS_EPS],
    )


def _n_vocab(meta: Metadata) -> int:
    """The tokens' count, as llama.cpp sizes token_embd by it; a vocab_size that disagrees is refused
    (the file would load and fail mid-generation on an id with no token)."""
    tokens = meta.get_array("tokenizer.ggml.tokens", "str", None)
    key = meta.arch_key("vocab_size")
    vocab_size = meta.get_int(key, None, min=1, max=INT32_MAX)
    if tokens is not None and vocab_size is not None and vocab_size != len(tokens):
        raise ModelLoadError(f"{meta.path}: metadata key {key!r} = {vocab_size} but tokenizer.ggml.tokens "
                             f"has {len(tokens)} entries")
    n_vocab = len(tokens) if tokens is not None else vocab_size
    if not n_vocab:
        raise ModelLoadError(f"{meta.path}: vocabulary size unknown (no {key}, no tokens)")
    return n_vocab


__getattr__ = removed_names(__name__)   # a removed name says what replaced it
