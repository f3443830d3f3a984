"""Which type each tensor of a model gets in a quantization mix, by llama.cpp's rules.

A mix (``Q4_K_M``, ``Q3_K_S``, ...) is a base tensor type plus promotions: the output matrix gets more
bits, the attention-V and FFN-down matrices of chosen layers get more bits, and a tensor whose rows
don't fit the type's block falls back to a type whose blocks do. The rules, names and file-type
numbers are llama.cpp's (src/llama-quant.cpp: llama_tensor_get_type, tensor_type_fallback,
tensor_allows_quantization; include/llama.h: llama_ftype), so for the same input and mix every
tensor gets the type llama-quantize gives it (with or without an importance matrix; with the same overrides,
except --tensor-type with a float mix, which llama-quantize ignores). The i-quant and ternary mixes
(IQ1_S .. IQ4_XS, TQ1_0, TQ2_0) follow the same function; the 1- and 2-bit i-quant types need an
importance matrix in llama.cpp (tensor_requires_imatrix), and a mix that would write one without it is
refused with llama-quantize's reason.

Rules that count layers (``i_attention_wv``, ``i_ffn_down``) count in llama.cpp's processing order,
tensors sorted by layer number then name, so the choice does not depend on the input file's order.

Besides the mixes, TYPE may name a tensor type (a plugin's too, overrides.writable_types): every
quantizable tensor gets that type, with no promotions, as in a --pure mix. The user's per-tensor
overrides (overrides.py) come before the rules, in llama_tensor_get_type's order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence

import gguf

from ggflow.core.types import type_traits
from ggflow.errors import ModelLoadError, QuantizationError, UnknownNameError
from ggflow.quantize_model.overrides import NO_OVERRIDES, TypeOverrides, find_writable_type, writable_types


@dataclass(frozen=True)
class Mix:
    name: str          # as llama-quantize names it
    ftype: int | None  # llama_ftype: written to general.file_type (None: llama.cpp has none for it)
    base_type: str     # the tensor type of every quantizable tensor before promotions
    rules: bool = True  # False for a plain tensor type: no promotions, as if --pure


# In llama-quantize's listing order.
MIXES: dict[str, Mix] = {m.name: m for m in (
    Mix("Q4_0", 2, "Q4_0"), Mix("Q4_1", 3, "Q4_1"), Mix("Q5_0", 8, "Q5_0"), Mix("Q5_1", 9, "Q5_1"),
    Mix("Q2_K", 10, "Q2_K"),
    Mix("Q3_K_S", 11, "Q3_K"), Mix("Q3_K_M", 12, "Q3_K"), Mix("Q3_K_L", 13, "Q3_K"),
    Mix("Q4_K_S", 14, "Q4_K"), Mix("Q4_K_M", 15, "Q4_K"),
    Mix("Q5_K_S", 16, "Q5_K"), Mix("Q5_K_M", 17, "Q5_K"),
    Mix("Q6_K", 18, "Q6_K"), Mix("Q8_0", 7, "Q8_0"),
    Mix("F16", 1, "F16"), Mix("BF16", 32, "BF16"), Mix("F32", 0, "F32"),
    # llama_ftype_get_default_type: note IQ2_S's base is IQ2_XS and IQ2_M's IQ2_S
    Mix("IQ2_XXS", 19, "IQ2_XXS"), Mix("IQ2_XS", 20, "IQ2_XS"), Mix("IQ2_S", 28, "IQ2_XS"),
    Mix("IQ2_M", 29, "IQ2_S"), Mix("IQ1_S", 24, "IQ1_S"), Mix("IQ1_M", 31, "IQ1_M"),
    Mix("TQ1_0", 36, "TQ1_0"), Mix("TQ2_0", 37, "TQ2_0"),
    Mix("IQ3_XXS", 23, "IQ3_XXS"), Mix("IQ3_S", 26, "IQ3_S"), Mix("IQ3_M", 27, "IQ3_S"),
    Mix("IQ3_XS", 22, "IQ3_S"), Mix("IQ4_NL", 25, "IQ4_NL"), Mix("IQ4_XS", 30, "IQ4_XS"),
)}
# The 1- and 2-bit i-quant mixes: their own branch of llama_tensor_get_type_impl.
_LOW_IQ = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")
_IQ2_SM = ("IQ2_S", "IQ2_M")
# Types llama.cpp refuses to write without an importance matrix (tensor_requires_imatrix).
NEEDS_IMATRIX = ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S")
# token_embd.weight (untied) in these mixes
_TOKEN_EMBD_TYPE = {"IQ2_XXS": "Q2_K", "IQ2_XS": "Q2_K", "IQ1_S": "Q2_K", "IQ1_M": "Q2_K", "IQ2_S": "IQ3_S",
                    "IQ2_M": "IQ3_S", "IQ3_XXS": "IQ3_S", "TQ1_0": "Q4_K", "TQ2_0": "Q4_K"}
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}  # llama-quantize's aliases


def find_mix(name: str) -> Mix:
    """A mix by llama.cpp's name (any case, aliases too) or its file-type number, else a plain
    tensor type that has a quantizer (a built-in or a plugin's)."""
    key = str(name).strip().upper()
    key = ALIASES.get(key, key)
    if key in MIXES:
        return MIXES[key]
    if key.isdigit():
        for mix in MIXES.values():
            if mix.ftype == int(key):
                return mix
    type_name = find_writable_type(key)
    if type_name is not None:
        return Mix(type_name, _llama_ftype(type_name), type_name, rules=False)
    raise UnknownMixError(str(name))


def _llama_ftype(type_name: str) -> int | None:
    """llama.cpp's LLAMA_FTYPE_MOSTLY_<TYPE> where it has one (IQ4_NL: 25, TQ2_0: 37), per gguf-py's copy."""
    ftype = getattr(gguf.LlamaFileType, f"MOSTLY_{type_name}", None)
    return None if ftype is None else int(ftype)


class UnknownMixError(UnknownNameError):
    """A TYPE that is neither a mix nor a writable tensor type; the message lists the mixes in
    llama-quantize's order, then the types."""

    def __init__(self, name: str):
        types = writable_types()
        super().__init__("quantization type", name, list(MIXES) + list(ALIASES) + types)
        aliases = ", ".join(f"{a} ({m})" for a, m in ALIASES.items())
        self.args = (f"unknown quantization type {name!r}; valid mixes: {', '.join(MIXES)}; aliases: {aliases}; "
                     f"or a tensor type, every quantizable tensor in it: {', '.join(types)}",)


# -- what the rules need to know about the model -------------------------------------------------
@dataclass(frozen=True)
class ModelFacts:
    """The hyperparameters llama.cpp's mix rules look at."""
    arch: str
    n_layer: int
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama.cpp's LLM_TYPE_70B, the one model size the rules single out (per-arch layer counts)."""
        if self.arch == "llama":
            return self.n_expert != 8 and self.n_layer == 80 and self.n_head != self.n_head_kv
        return self.n_layer == {"qwen2": 80, "deci": 80, "olmo": 80, "jais2": 68}.get(self.arch, -1)


@dataclass(frozen=True)
class TensorDesc:
    name: str
    ne: tuple[int, ...]   # GGUF order: ne[0] is the row length
    type_name: str        # the type it has in the input


@dataclass(frozen=True)
class TypeChoice:
    name: str
    type_name: str             # the type it gets in the output
    fallback_from: str | None  # the type the rules chose, when the row length forced another


# -- tensor categories -------------------------------------------------------------------------
class Category(Enum):
    TOKEN_EMBD = "token_embd"
    ATTN_Q = "attn_q"
    ATTN_K = "attn_k"
    ATTN_V = "attn_v"
    ATTN_QKV = "attn_qkv"
    ATTN_KV_B = "attn_kv_b"
    ATTN_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OUTPUT = "output"
    OTHER = "other"


# First match wins; substrings, as llama.cpp matches them (so "ffn_down_exps" is FFN_DOWN too).
_CATEGORY_BY_SUBSTRING = (
    ("attn_qkv.weight", Category.ATTN_QKV), ("attn_kv_b.weight", Category.ATTN_KV_B),
    ("attn_v.weight", Category.ATTN_V), ("attn_k.weight", Category.ATTN_K), ("attn_q.weight", Category.ATTN_Q),
    ("attn_output.weight", Category.ATTN_OUTPUT),
    ("ffn_up", Category.FFN_UP), ("ffn_gate", Category.FFN_GATE), ("ffn_down", Category.FFN_DOWN),
)
# attn_qkv and attn_kv_b hold V too, so they get V's promotions and count as V layers.
_V_LIKE = (Category.ATTN_V, Category.ATTN_QKV, Category.ATTN_KV_B)


def category(name: str) -> Category:
    if name == "output.weight":
        return Category.OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return Category.TOKEN_EMBD
    for part, cat in _CATEGORY_BY_SUBSTRING:
        if part in name:
            return cat
    return Category.OTHER


# -- which tensors are quantized at all ---------------------------------------------------------
# Tensors that stay as they are: small, routing tables, positions, convolution kernels, ...
_NEVER_QUANTIZED_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
    ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_NEVER_QUANTIZED_NAMES = ("position_embd.weight", "token_types.weight")
_NEVER_QUANTIZED_BY_ARCH = {
    "glm5-next": ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
                  "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
                  "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
                  "attn_v_b.weight"),
}


def allows_quantization(t: TensorDesc, arch: str) -> bool:
    """Matrices (2-D, or 3-D expert stacks) named *weight, except the ones llama.cpp keeps as they are."""
    n_dims = max((i + 1 for i, n in enumerate(t.ne) if n != 1), default=1)
    if n_dims < 2 or not t.name.endswith("weight") or t.name in _NEVER_QUANTIZED_NAMES:
        return False
    excluded = _NEVER_QUANTIZED_SUBSTRINGS + _NEVER_QUANTIZED_BY_ARCH.get(arch, ())
    return not any(part in t.name for part in excluded)


# -- the rules -----------------------------------------------------------------------------------
def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The layers the _M mixes promote: the first and last eighth, and every third in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _block_size(type_name: str) -> int:
    return type_traits(type_name).block_size


class _Counters:
    """llama.cpp's quantize_state_impl: per-category counters that advance as tensors are typed."""

    def __init__(self, tensors: Sequence[TensorDesc], facts: ModelFacts):
        self.n_attention_wv = sum(category(t.name) in _V_LIKE for t in tensors)
        self.n_layer = facts.n_layer
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.has_imatrix = False
        self.tied_embeddings = not any(category(t.name) is Category.OUTPUT for t in tensors)


_BLK = re.compile(r"blk\.(\d+)\.")


def _layer_of(counter: int, name: str, facts: ModelFacts) -> int:
    # Expert FFNs need not come one per layer in order, so with experts the name tells the layer.
    if facts.n_expert <= 1:
        return counter
    m = _BLK.match(name)
    if m is None or not 0 <= int(m.group(1)) < facts.n_layer:
        raise ModelLoadError(f"cannot tell the layer of tensor {name!r} (expected blk.N. with N < {facts.n_layer})")
    return int(m.group(1))


def _output_type(base: str, t: TensorDesc, facts: ModelFacts, override: str | None, mix: str = "") -> str:
    if override is not None:  # --output-tensor-type reaches tied embeddings here (still with the fallback)
        return override
    if facts.arch == "falcon" or t.ne[0] % _block_size(base):
        return "Q8_0"
    if mix in _LOW_IQ or mix == "IQ3_XXS":
        return "Q5_K"
    return base if base == "Q8_0" else "Q6_K"


def _attn_v_type(new: str, mix: Mix, facts: ModelFacts, st: _Counters) -> str:
    name, i = mix.name, st.i_attention_wv
    if name == "Q2_K":
        new = "Q4_K" if facts.n_gqa >= 4 else "Q3_K"
    elif name == "Q3_K_M":
        new = "Q5_K" if i < 2 else "Q4_K"
    elif name == "Q3_K_L":
        new = "Q5_K"
    elif name in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, st.n_attention_wv):
        new = "Q6_K"
    elif name == "Q4_K_S" and i < 4:
        new = "Q5_K"
    elif name == "IQ3_XXS":
        new = "Q4_K" if facts.n_gqa >= 4 else "IQ3_XXS" if st.has_imatrix else "IQ3_S"
    elif name in ("IQ3_XS", "IQ3_S") and facts.n_gqa >= 4:
        new = "Q4_K"
    elif name == "IQ3_M":
        new = "Q4_K"
    elif name in ("IQ4_NL", "IQ4_XS") and facts.n_gqa >= 4:
        new = "Q5_K"
    if facts.is_70b and new in ("Q3_K", "Q4_K"):
        new = "Q5_K"  # 8 heads share V in a 70B: more bits for V cost little there
    if facts.n_expert == 8:
        new = "Q8_0"
    return new


def _ffn_down_type(new: str, mix: Mix, facts: ModelFacts, i: int, n: int, has_imatrix: bool = False) -> str:
    falcon, name = facts.arch == "falcon", mix.name
    if name == "Q2_K":
        return "Q3_K"
    if name == "IQ3_XXS" and not has_imatrix:
        return "Q4_K" if i < n // 8 else "Q3_K"
    if name == "IQ3_M" and (i < n // 8 or (facts.n_expert == 8 and use_more_bits(i, n))):
        return "Q4_K"
    if name in ("IQ4_NL", "IQ4_XS") and i < n // 8 and not has_imatrix:
        return "Q5_K"
    if name in ("Q4_0", "Q5_0") and has_imatrix and i < n // 8:
        return "Q4_1" if name == "Q4_0" else "Q5_1"  # llama.cpp's guard, only with an imatrix
    if name == "Q3_K_M":
        return "Q5_K" if i < n // 16 else "Q4_K" if not falcon or use_more_bits(i, n) else "Q3_K"
    if name == "Q3_K_L":
        return "Q4_K" if falcon else "Q5_K"
    if name == "Q4_K_M":
        if falcon:
            return "Q6_K" if i < n // 16 else "Q5_K" if use_more_bits(i, n) else "Q4_K"
        return "Q6_K" if use_more_bits(i, n) else new
    if name == "Q5_K_M" and use_more_bits(i, n):
        return "Q6_K"
    if name == "Q4_K_S" and not falcon and i < n // 8:
        return "Q5_K"
    return new


_ATTN_OUTPUT_8_EXPERTS_Q5_K = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ3_XS", "IQ3_XXS", "IQ4_NL",
                               "IQ3_S", "IQ3_M", "IQ4_XS")


def _attn_output_type(new: str, mix: Mix, facts: ModelFacts) -> str:
    if facts.arch == "falcon":
        return "Q4_K" if mix.name == "Q3_K_L" else new
    if facts.n_expert == 8:
        return "Q5_K" if mix.name in _ATTN_OUTPUT_8_EXPERTS_Q5_K else new
    return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_XXS": "IQ3_S", "IQ3_M": "Q4_K"}.get(mix.name, new)


def _low_iq_type(new: str, cat: "Category", mix: Mix, facts: ModelFacts, st: _Counters) -> str:
    """The 1- and 2-bit i-quant mixes: Q2_K / IQ3_S / Q4_K for the tensors that matter most."""
    sm = mix.name in _IQ2_SM
    if cat in _V_LIKE:
        new = "Q4_K" if facts.n_gqa >= 4 or facts.n_expert >= 4 else "IQ3_S" if sm else "Q2_K"
        st.i_attention_wv += 1
    elif facts.n_expert == 8 and cat is Category.ATTN_K:
        new = "Q4_K"
    elif cat is Category.FFN_DOWN:
        if st.i_ffn_down < st.n_layer // 8:   # the counter itself, not the layer, in this branch
            new = "IQ3_S" if sm else "Q2_K"
        st.i_ffn_down += 1
    elif cat is Category.ATTN_OUTPUT:
        if facts.n_expert == 8:
            new = "Q5_K"
        elif mix.name in ("IQ1_S", "IQ1_M"):
            new = "IQ2_XXS"
        elif sm:
            new = "IQ3_S"
    return new


def _ffn_up_gate_type(new: str, mix: Mix, i: int, n: int) -> str:
    return "IQ3_XXS" if mix.name == "IQ3_XS" and n // 8 <= i < 7 * n // 8 else new


def _mix_type(t: TensorDesc, mix: Mix, facts: ModelFacts, st: _Counters, output_override: str | None) -> str:
    """llama_tensor_get_type_impl for the mixes ggflow offers (no importance matrix)."""
    new, cat = mix.base_type, category(t.name)
    if facts.arch == "glm5-next" and any(p in t.name for p in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
        return "Q8_0"
    if cat is Category.OUTPUT or (st.tied_embeddings and cat is Category.TOKEN_EMBD):
        return _output_type(new, t, facts, output_override, mix.name)
    if cat is Category.TOKEN_EMBD:
        return _TOKEN_EMBD_TYPE.get(mix.name, new)
    if mix.name in _LOW_IQ:
        return _low_iq_type(new, cat, mix, facts, st)
    if cat in _V_LIKE:
        new = _attn_v_type(new, mix, facts, st)
        st.i_attention_wv += 1
    elif cat is Category.ATTN_K:
        if facts.n_expert == 8:
            new = "Q8_0"
        elif mix.name in ("IQ3_XS", "IQ3_XXS"):
            new = "IQ3_XXS" if mix.name == "IQ3_XS" else "IQ2_S"
    elif cat is Category.ATTN_Q and mix.name in ("IQ3_XS", "IQ3_XXS"):
        new = "IQ3_XXS" if mix.name == "IQ3_XS" else "IQ2_S"
    elif cat is Category.FFN_DOWN:
        new = _ffn_down_type(new, mix, facts, _layer_of(st.i_ffn_down, t.name, facts), st.n_layer, st.has_imatrix)
        st.i_ffn_down += 1
    elif cat is Category.ATTN_OUTPUT:
        new = _attn_output_type(new, mix, facts)
    elif cat is Category.FFN_GATE:
        new = _ffn_up_gate_type(new, mix, _layer_of(st.i_ffn_gate, t.name, facts), st.n_layer)
        st.i_ffn_gate += 1
    elif cat is Category.FFN_UP:
        new = _ffn_up_gate_type(new, mix, _layer_of(st.i_ffn_up, t.name, facts), st.n_layer)
        st.i_ffn_up += 1
    return new


# llama.cpp's tensor_type_fallback: each 256-block type steps down to a 32-block type.
_SMALLER_BLOCK = {
    "IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL",
    "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL",
    "Q2_0": "Q4_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0",
    "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
}


def fallback_type(ncols: int, wanted: str) -> str:
    """A type whose blocks fit a row of ncols, for a type whose blocks don't (else `wanted`).

    As llama.cpp: a type of its table steps down to a 32-block type; a type of 32 or fewer elements
    per block has no smaller one; if the row still doesn't fit, F16. Any other type (a plugin's with
    larger blocks) has no fallback: QuantizationError.
    """
    block = _block_size(wanted)
    if ncols % block == 0:
        return wanted
    smaller = _SMALLER_BLOCK.get(wanted, wanted if block <= 32 else None)
    if smaller is None:
        raise QuantizationError(f"rows of {ncols} elements are not a multiple of {wanted}'s block of {block}, "
                                f"and llama.cpp defines no fallback for {wanted}")
    if find_writable_type(smaller) is None:
        raise QuantizationError(f"rows of {ncols} elements are not a multiple of {wanted}'s block of {block}; "
                                f"llama.cpp falls back to {smaller}, which no plugin registers with a quantizer")
    return smaller if ncols % _block_size(smaller) == 0 else "F16"


def _processing_order(tensors: Sequence[TensorDesc]) -> list[TensorDesc]:
    """llama.cpp's weights_map order: layer number (non-layer tensors first), then name."""
    def key(t: TensorDesc) -> tuple[int, str]:
        m = _BLK.match(t.name)
        return (int(m.group(1)) if m else -1, t.name)
    return sorted(tensors, key=key)


def choose_types(tensors: Iterable[TensorDesc], mix: Mix, facts: ModelFacts, pure: bool = False,
                 overrides: TypeOverrides = NO_OVERRIDES, has_imatrix: bool = False) -> dict[str, TypeChoice]:
    """name -> the output type of every tensor. pure: every quantizable tensor in the base type.

    llama_tensor_get_type's order: tensors that aren't quantized keep their type; then
    --token-embedding-type and --output-tensor-type, as given; then the first --tensor-type
    pattern that matches, or else the mix's rules (unless pure); then the row-length fallback.
    """
    tensors = list(tensors)
    st = _Counters(tensors, facts)
    st.has_imatrix = has_imatrix
    rules = mix.rules and not pure and type_traits(mix.base_type).is_quantized
    choices: dict[str, TypeChoice] = {}
    for t in _processing_order(tensors):
        if not allows_quantization(t, facts.arch):
            choices[t.name] = TypeChoice(t.name, t.type_name, None)
            continue
        direct = _direct_override(t, overrides)
        if direct is not None:
            choices[t.name] = TypeChoice(t.name, _fitting(t, *direct), None)
            continue
        wanted = overrides.tensor_type_for(t.name)
        if wanted is None:
            wanted = _mix_type(t, mix, facts, st, overrides.output_type) if rules else mix.base_type
        try:
            final = fallback_type(t.ne[0], wanted)
        except QuantizationError as exc:
            raise QuantizationError(f"tensor {t.name!r}: {exc}; give it another type with --tensor-type") from None
        _check_writable(t, final, has_imatrix)
        choices[t.name] = TypeChoice(t.name, final, wanted if final != wanted else None)
    return choices


def requires_imatrix(name: str, type_name: str) -> bool:
    """llama.cpp's tensor_requires_imatrix (its Q2_K_S case aside: ggflow offers no Q2_K_S mix)."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return type_name in NEEDS_IMATRIX


def _check_writable(t: TensorDesc, final: str, has_imatrix: bool) -> None:
    if final == t.type_name:
        return
    if not has_imatrix and requires_imatrix(t.name, final):
        raise QuantizationError(
            f"this quantization requires an importance matrix (llama-quantize: 'this quantization requires an "
            f"imatrix!'): tensor {t.name!r} would be {final}, which llama.cpp writes only with importance "
            f"weights: give an importance matrix with --imatrix FILE (`ggflow imatrix` computes one), choose "
            f"IQ4_XS, IQ4_NL, TQ1_0, TQ2_0 or a K-quant mix, or give the tensor another type with --tensor-type")
    if type_traits(final).from_float is None:
        raise QuantizationError(f"tensor {t.name!r} would be {final}, which ggflow can read but not write yet "
                                f"(no quantizer for it); choose another mix or give the tensor a type with "
                                f"--tensor-type")


def _direct_override(t: TensorDesc, overrides: TypeOverrides) -> tuple[str, str] | None:
    """(type, option) where --token-embedding-type or --output-tensor-type types t outright."""
    cat = category(t.name)
    if overrides.token_embedding_type and cat is Category.TOKEN_EMBD:
        # per_layer_token_embd is a large table of its own: a --tensor-type pattern that names it wins
        if not (t.name == "per_layer_token_embd.weight" and overrides.tensor_type_for(t.name)):
            return overrides.token_embedding_type, "token_embedding_type"
    if overrides.output_type and cat is Category.OUTPUT:
        return overrides.output_type, "output_tensor_type"
    return None


def _fitting(t: TensorDesc, type_name: str, option: str) -> str:
    """llama.cpp applies these two options without its fallback: a row that doesn't fit is an error."""
    block = _block_size(type_name)
    if t.ne[0] % block:
        raise QuantizationError(f"{option}={type_name}: tensor {t.name!r} has rows of {t.ne[0]} elements, not a "
                                f"multiple of {type_name}'s block of {block}; choose a type whose block divides "
                                f"{t.ne[0]}")
    return type_name
