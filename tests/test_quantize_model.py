"""ggflow quantize: llama.cpp's mix rules per tensor, the bytes of ggflow's quantizers, metadata, atomic writes.

The expected types below were derived by reading llama.cpp's src/llama-quant.cpp (llama_tensor_get_type_impl,
tensor_type_fallback), not by running ggflow. During development every mix here (and --pure) was also run
through llama.cpp's own llama_model_quantize on the same tiny models: every tensor had the same type and the
same bytes, and the metadata was the same (docs/quantization.md, "Quantizing a model").
"""
from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest

import ggflow
import ggflow.quantize_model.convert as qm_convert
from ggflow.cli import main
from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_OK, Context
from ggflow.core.gguf_file import GGUFFile
from ggflow.core.model import Model
from ggflow.errors import GGFlowError, ModelLoadError, QuantizationError, UnknownNameError
from ggflow.quantize_model.mixes import MIXES, ModelFacts, TensorDesc, choose_types, fallback_type, find_mix, use_more_bits
from ggflow.quantize_model import quantize_model
from tests.fixtures import tiny_models
from tests.fixtures.tiny_models import TinySpec, write_tiny_model
from tests.data_dir import DATA

N_LAYER = 8
# An 8-layer llama whose rows are all multiples of 256, so K types need no fallback. n_head 4 over
# n_head_kv 1 gives n_gqa 4, which Q2_K's attn_v rule looks at.
LLAMA8 = TinySpec("llama", 256, 4, 1, N_LAYER, 512, 256)
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
TOKENS = [5, 17, 42, 100, 7, 3, 250, 12, 9, 77, 31, 64]


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama8(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("llama8") / "llama8-F32.gguf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tiny_models.SPECS, "llama", LLAMA8)
        write_tiny_model(path, "llama", "F32", seed=3)
    return path


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """quantized(src, mix, pure=False) -> (path, report), each quantization done once per module."""
    root = tmp_path_factory.mktemp("quantized")
    done: dict = {}

    def make(src: Path, mix: str, pure: bool = False):
        key = (str(src), mix, pure)
        if key not in done:
            out = root / f"{Path(src).stem}-{mix}{'-pure' if pure else ''}.gguf"
            done[key] = (out, quantize_model(src, out, mix, pure=pure, progress=False))
        return done[key]
    return make


def tensor_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


# -- expected types (from llama-quant.cpp) --------------------------------------------------------
# use_more_bits(i, 8): i < 8/8, i >= 7*8/8, or (i - 8/8) % 3 == 2, so layers 0, 3, 6 and 7.
PROMOTED = [0, 3, 6, 7]


def per_layer(promoted: str, other: str, layers=PROMOTED) -> list[str]:
    return [promoted if i in layers else other for i in range(N_LAYER)]


# mix -> (base, token_embd, output, {matrix: per-layer types that differ from base})
LLAMA8_EXPECTED = {
    "Q4_K_M": ("Q4_K", "Q4_K", "Q6_K", {"attn_v": per_layer("Q6_K", "Q4_K"), "ffn_down": per_layer("Q6_K", "Q4_K")}),
    "Q5_K_M": ("Q5_K", "Q5_K", "Q6_K", {"attn_v": per_layer("Q6_K", "Q5_K"), "ffn_down": per_layer("Q6_K", "Q5_K")}),
    # attn_v: the first 4 V layers; ffn_down: i < n_layer/8
    "Q4_K_S": ("Q4_K", "Q4_K", "Q6_K", {"attn_v": per_layer("Q5_K", "Q4_K", range(4)),
                                         "ffn_down": per_layer("Q5_K", "Q4_K", [0])}),
    "Q5_K_S": ("Q5_K", "Q5_K", "Q6_K", {}),
    # attn_v: the first 2 V layers Q5_K, the rest Q4_K; ffn_down: i < n_layer/16 (none) Q5_K, else Q4_K
    "Q3_K_M": ("Q3_K", "Q3_K", "Q6_K", {"attn_v": per_layer("Q5_K", "Q4_K", range(2)), "ffn_down": ["Q4_K"] * 8,
                                         "attn_output": ["Q4_K"] * 8}),
    "Q3_K_L": ("Q3_K", "Q3_K", "Q6_K", {"attn_v": ["Q5_K"] * 8, "ffn_down": ["Q5_K"] * 8,
                                         "attn_output": ["Q5_K"] * 8}),
    "Q3_K_S": ("Q3_K", "Q3_K", "Q6_K", {}),
    # attn_v: n_gqa >= 4 -> Q4_K
    "Q2_K": ("Q2_K", "Q2_K", "Q6_K", {"attn_v": ["Q4_K"] * 8, "ffn_down": ["Q3_K"] * 8, "attn_output": ["Q3_K"] * 8}),
    "Q6_K": ("Q6_K", "Q6_K", "Q6_K", {}),
    "Q8_0": ("Q8_0", "Q8_0", "Q8_0", {}),
    "Q4_0": ("Q4_0", "Q4_0", "Q6_K", {}),   # output: Q6_K unless the mix is Q8_0
    "Q5_1": ("Q5_1", "Q5_1", "Q6_K", {}),
    "F16": ("F16", "F16", "F16", {}),       # float mixes: no rules, every matrix in the type
    "BF16": ("BF16", "BF16", "BF16", {}),
}


def llama8_expected(base: str, token_embd: str, output: str, promoted: dict[str, list[str]]) -> dict[str, str]:
    want = {"token_embd.weight": token_embd, "output.weight": output, "output_norm.weight": "F32"}
    for il in range(N_LAYER):
        want[f"blk.{il}.attn_norm.weight"] = want[f"blk.{il}.ffn_norm.weight"] = "F32"
        for m in MATRICES:
            want[f"blk.{il}.{m}.weight"] = promoted.get(m, [base] * N_LAYER)[il]
    return want


@pytest.mark.parametrize("mix", list(LLAMA8_EXPECTED))
def test_each_tensor_gets_the_type_llama_cpp_rules_give(llama8, quantized, mix):
    out, report = quantized(llama8, mix)
    assert tensor_types(out) == llama8_expected(*LLAMA8_EXPECTED[mix])
    assert not report.fallbacks


def test_pure_puts_every_matrix_in_the_base_type(llama8, quantized):
    out, _ = quantized(llama8, "Q4_K_M", pure=True)
    assert tensor_types(out) == llama8_expected("Q4_K", "Q4_K", "Q4_K", {})


def test_use_more_bits_picks_the_first_and_last_eighth_and_every_third_between():
    assert [i for i in range(8) if use_more_bits(i, 8)] == PROMOTED
    # 32 layers: 0..3, 28..31, and 4 + 3k + 2
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


# -- rows that are not a multiple of 256: llama.cpp's fallbacks -----------------------------------
def test_tiny_llama_q4_k_m_falls_back_where_rows_are_128(tiny_model_path, quantized):
    # n_embd 128: rows of 128 don't fit Q4_K (-> Q5_0) or Q6_K (-> Q8_0); ffn_down's rows are n_ff = 256.
    # output: 128 % 256 != 0 -> Q8_0 directly. n_attention_wv = 2: use_more_bits(i, 2) holds for layer 1.
    out, report = quantized(tiny_model_path("llama"), "Q4_K_M")
    want = {"token_embd.weight": "Q5_0", "output.weight": "Q8_0", "output_norm.weight": "F32"}
    for il in range(2):
        want |= {f"blk.{il}.attn_norm.weight": "F32", f"blk.{il}.ffn_norm.weight": "F32"}
        want |= {f"blk.{il}.{m}.weight": "Q5_0" for m in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")}
    want |= {"blk.0.attn_v.weight": "Q5_0", "blk.1.attn_v.weight": "Q8_0",
             "blk.0.ffn_down.weight": "Q4_K", "blk.1.ffn_down.weight": "Q6_K"}
    assert tensor_types(out) == want
    assert {t.name: t.fallback_from for t in report.fallbacks}["blk.1.attn_v.weight"] == "Q6_K"
    assert len(report.fallbacks) == 13  # every 128-row matrix but output


def test_tiny_llama_q2_k_falls_back_to_q4_0(tiny_model_path, quantized):
    # n_gqa = 4/2 = 2 < 4: attn_v Q3_K; rows of 128 take Q2_K/Q3_K to Q4_0; ffn_down (rows of 256) stays Q3_K
    out, _ = quantized(tiny_model_path("llama"), "Q2_K")
    types = tensor_types(out)
    assert types["blk.0.attn_v.weight"] == types["blk.0.attn_q.weight"] == types["token_embd.weight"] == "Q4_0"
    assert types["blk.0.ffn_down.weight"] == types["blk.1.ffn_down.weight"] == "Q3_K"
    assert types["output.weight"] == "Q8_0"


def test_tied_embeddings_get_the_output_rule(tiny_model_path, quantized):
    # qwen2 has no output.weight, so token_embd is typed as the output: 128 % 256 -> Q8_0; biases stay F32
    out, _ = quantized(tiny_model_path("qwen2"), "Q4_K_M")
    types = tensor_types(out)
    assert types["token_embd.weight"] == "Q8_0"
    assert types["blk.0.attn_q.bias"] == types["blk.1.attn_v.bias"] == "F32"
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(2)] == ["Q5_0", "Q8_0"]


def test_gpt2_keeps_position_embeddings_and_treats_attn_qkv_as_v(tiny_model_path, quantized):
    out, _ = quantized(tiny_model_path("gpt2"), "Q4_K_M")
    types = tensor_types(out)
    assert types["position_embd.weight"] == "F32"  # never quantized
    assert types["token_embd.weight"] == "Q8_0"    # tied
    assert [types[f"blk.{i}.attn_qkv.weight"] for i in range(2)] == ["Q5_0", "Q8_0"]  # V's rule, Q6_K -> Q8_0
    assert [types[f"blk.{i}.ffn_down.weight"] for i in range(2)] == ["Q4_K", "Q6_K"]  # rows of n_ff = 512


def test_qwen3_with_256_rows_needs_no_fallback(tiny_model_path, quantized):
    out, report = quantized(tiny_model_path("qwen3"), "Q4_K_M")
    types = tensor_types(out)
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(2)] == ["Q4_K", "Q6_K"]
    assert types["blk.0.attn_q_norm.weight"] == "F32"
    assert not report.fallbacks


@pytest.mark.parametrize("ncols, wanted, got", [
    (128, "Q2_K", "Q4_0"), (128, "Q3_K", "Q4_0"), (128, "Q4_K", "Q5_0"), (128, "Q5_K", "Q5_1"),
    (128, "Q6_K", "Q8_0"), (256, "Q4_K", "Q4_K"), (100, "Q4_K", "F16"), (100, "Q8_0", "F16"), (96, "Q4_0", "Q4_0"),
])
def test_fallback_type(ncols, wanted, got):
    assert fallback_type(ncols, wanted) == got


# -- rules for model kinds the tiny models don't have ---------------------------------------------
def llama_tensors(n_layer: int, n_embd: int = 256) -> list[TensorDesc]:
    ts = [TensorDesc("token_embd.weight", (n_embd, 1000), "F32"), TensorDesc("output.weight", (n_embd, 1000), "F32")]
    for il in range(n_layer):
        ts += [TensorDesc(f"blk.{il}.{m}.weight", (n_embd, n_embd), "F32") for m in MATRICES]
        ts.append(TensorDesc(f"blk.{il}.attn_norm.weight", (n_embd,), "F32"))
    return ts


def types_of(tensors, mix, facts, pure=False):
    return {n: c.type_name for n, c in choose_types(tensors, find_mix(mix), facts, pure).items()}


def test_q2_k_attn_v_depends_on_gqa():
    ts = llama_tensors(2)
    assert types_of(ts, "Q2_K", ModelFacts("llama", 2, 8, 8))["blk.0.attn_v.weight"] == "Q3_K"
    assert types_of(ts, "Q2_K", ModelFacts("llama", 2, 8, 2))["blk.0.attn_v.weight"] == "Q4_K"


def test_70b_llama_gets_q5_k_attn_v():
    ts = llama_tensors(80)
    gqa = types_of(ts, "Q4_K_M", ModelFacts("llama", 80, 64, 8))
    # use_more_bits(i, 80) holds for layers 0..9; layer 10 is Q4_K, bumped to Q5_K in a 70B
    assert gqa["blk.10.attn_v.weight"] == "Q5_K" and gqa["blk.0.attn_v.weight"] == "Q6_K"
    mha = types_of(ts, "Q4_K_M", ModelFacts("llama", 80, 64, 64))  # a 65B: no bump
    assert mha["blk.10.attn_v.weight"] == "Q4_K"


def test_eight_experts_bump_attention():
    t = types_of(llama_tensors(4), "Q4_K_M", ModelFacts("llama", 4, 8, 8, n_expert=8))
    assert t["blk.1.attn_v.weight"] == t["blk.1.attn_k.weight"] == "Q8_0"
    assert t["blk.1.attn_output.weight"] == "Q5_K"


def test_falcon_output_is_q8_0():
    assert types_of(llama_tensors(2), "Q4_K_M", ModelFacts("falcon", 2, 8, 8))["output.weight"] == "Q8_0"


def test_types_do_not_depend_on_the_tensor_order_in_the_file():
    ts, facts = llama_tensors(8), ModelFacts("llama", 8, 8, 8)
    assert types_of(ts[::-1], "Q3_K_M", facts) == types_of(ts, "Q3_K_M", facts)


def test_mix_names_as_llama_quantize_takes_them():
    assert find_mix("q4_k_m") is MIXES["Q4_K_M"] and find_mix("Q4_K") is MIXES["Q4_K_M"]
    assert find_mix("15") is MIXES["Q4_K_M"]
    assert [MIXES[m].ftype for m in ("F32", "F16", "Q4_0", "Q8_0", "Q2_K", "Q4_K_M", "Q6_K", "BF16")] == \
        [0, 1, 2, 7, 10, 15, 18, 32]
    with pytest.raises(UnknownNameError, match="Q4_K_M.*Q6_K"):
        find_mix("Q4_K_XL")


# -- bytes, metadata, layout ----------------------------------------------------------------------
def raw_tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def row_bytes(t: gguf.ReaderTensor) -> np.ndarray:
    ne = [int(n) for n in t.shape]
    return np.asarray(t.data).view(np.uint8).reshape(int(np.prod(ne[1:])), -1)


# Between them these write every type the mixes use: Q2_K..Q6_K, Q4_0, Q5_1, Q8_0, F16, BF16.
@pytest.mark.parametrize("mix", ["Q4_K_M", "Q3_K_M", "Q2_K", "Q8_0", "Q4_0", "Q5_1", "F16", "BF16"])
def test_tensor_bytes_are_ggflow_quantize_of_the_input(llama8, quantized, mix):
    out, _ = quantized(llama8, mix)
    src, dst = raw_tensors(llama8), raw_tensors(out)
    for name, t in dst.items():
        s = src[name]
        if t.tensor_type == s.tensor_type:
            assert bytes(row_bytes(t)) == bytes(row_bytes(s)), name
        else:
            floats = ggflow.dequantize(row_bytes(s), s.tensor_type.name)
            np.testing.assert_array_equal(row_bytes(t), ggflow.quantize(floats, t.tensor_type.name), err_msg=name)


SHARED_MODELS = DATA / "models"


# tests/data/models holds tiny models that llama.cpp's llama-quantize wrote from the F32 files beside them.
@pytest.mark.parametrize("f32, llama_cpp_output, mix", [
    ("tiny-llama-hs-f32", "tiny-llama-hs-q4_k_m", "Q4_K_M"), ("tiny-llama-hs-f32", "tiny-llama-hs-q4_0", "Q4_0"),
    ("tiny-llama-hs-f32", "tiny-llama-hs-q8_0", "Q8_0"), ("tiny-qwen2-hs-f32", "tiny-qwen2-hs-q8_0", "Q8_0"),
    ("tiny-gpt2-hs-f32", "tiny-gpt2-hs-q8_0", "Q8_0"),
])
def test_same_tensors_and_metadata_as_llama_quantize(quantized, f32, llama_cpp_output, mix):
    src, ref = SHARED_MODELS / f"{f32}.gguf", SHARED_MODELS / f"{llama_cpp_output}.gguf"
    out, _ = quantized(src, mix)
    ours, theirs = raw_tensors(out), raw_tensors(ref)
    assert sorted(ours) == sorted(theirs)
    for name, t in theirs.items():
        assert ours[name].tensor_type == t.tensor_type, name
        assert bytes(row_bytes(ours[name])) == bytes(row_bytes(t)), name
    assert fields(out) == fields(ref)


def test_tensor_order_names_and_shapes_are_kept(tiny_model_path, quantized):
    src = tiny_model_path("gpt2")
    out, _ = quantized(src, "Q4_K_M")
    a, b = gguf.GGUFReader(src).tensors, gguf.GGUFReader(out).tensors
    assert [(t.name, list(t.shape)) for t in a] == [(t.name, list(t.shape)) for t in b]


def field_value(f):
    """A field's value with strings as raw bytes, so non-UTF-8 strings compare too."""
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[-1])
    if f.types[-1] == gguf.GGUFValueType.STRING:
        return [bytes(f.parts[i]) for i in f.data]
    return f.contents()


def fields(path: Path) -> dict:
    """key -> (value types, value) of every metadata key, the element type of arrays included."""
    r = gguf.GGUFReader(path)
    return {k: (list(f.types), field_value(f)) for k, f in r.fields.items() if not k.startswith("GGUF.")}


def test_metadata_is_kept_and_file_type_set(llama8, quantized):
    out, report = quantized(llama8, "Q4_K_M")
    before, after = fields(llama8), fields(out)
    assert after.pop("general.file_type") == ([gguf.GGUFValueType.UINT32], 15)
    assert after.pop("general.quantization_version") == ([gguf.GGUFValueType.UINT32], 2)
    before.pop("general.file_type")
    assert after == before
    assert report.ftype == 15 and report.mix == "Q4_K_M"


def write_odd_model(path: Path) -> dict:
    """Not a runnable model: odd metadata (alignment 64, arrays of several element types, an empty array,
    non-UTF-8 string bytes) and tensors in F16, BF16, Q8_0 and a 3-D stack. Returns the float data."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_uint16("test.u16", 7)
    w.add_int64("test.i64", -5)
    w.add_float64("test.f64", 0.1)
    w.add_bool("test.flag", True)
    w.add_key_value("test.i16s", [1, -2, 3], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT16)
    w.add_key_value("test.u8s", [1, 2, 255], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
    w.add_key_value("test.f32s", [0.5, -1.25], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
    w.add_key_value("test.bools", [True, False], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
    w.add_array("test.strings", ["a", "βγ", ""])
    w.add_key_value("test.raw", b"\xff\xfe ok", gguf.GGUFValueType.STRING)
    data = {
        "blk.0.attn_q.weight": rng.standard_normal((64, 96)).astype(np.float32),
        "blk.0.attn_norm.weight": rng.standard_normal(96).astype(np.float32),
        "blk.1.ffn_down_exps.weight": rng.standard_normal((3, 4, 64)).astype(np.float32),
        "blk.1.attn_v.weight": rng.standard_normal((16, 96)).astype(np.float32),
        "blk.1.attn_k.weight": rng.standard_normal((16, 96)).astype(np.float32),
    }
    w.add_tensor("blk.0.attn_q.weight", data["blk.0.attn_q.weight"].astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", data["blk.0.attn_norm.weight"])
    w.add_tensor("blk.1.ffn_down_exps.weight", ggflow.quantize(data["blk.1.ffn_down_exps.weight"], "BF16"),
                 raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.add_tensor("blk.1.attn_v.weight", ggflow.quantize(data["blk.1.attn_v.weight"], "Q8_0"),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.1.attn_k.weight", ggflow.quantize(data["blk.1.attn_k.weight"], "Q4_0"),
                 raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return data


def append_empty_array(path: Path, key: str) -> None:
    """gguf-py won't write an empty array; GGUF allows one. Patch it into the file's KV section."""
    raw = bytearray(path.read_bytes())
    n_kv_at = 16
    n_kv = int.from_bytes(raw[n_kv_at:n_kv_at + 8], "little")
    kb = key.encode()
    entry = len(kb).to_bytes(8, "little") + kb + (9).to_bytes(4, "little") + (5).to_bytes(4, "little") + bytes(8)
    # insert after the header (24 bytes): the first KV; tensor offsets are relative to the data section,
    # which moves by len(entry), so pad the entry's shift up to the alignment with a dummy string key
    pad_key = b"test.pad"
    shift = len(entry) + 8 + len(pad_key) + 4 + 8
    pad = (-shift) % 64
    pad_entry = len(pad_key).to_bytes(8, "little") + pad_key + (8).to_bytes(4, "little") + pad.to_bytes(8, "little") \
        + b"x" * pad
    raw[24:24] = entry + pad_entry
    raw[n_kv_at:n_kv_at + 8] = (n_kv + 2).to_bytes(8, "little")
    path.write_bytes(bytes(raw))


def test_odd_metadata_alignment_and_input_types_survive(tmp_path):
    src, out = tmp_path / "odd.gguf", tmp_path / "odd-q8.gguf"
    write_odd_model(src)
    append_empty_array(src, "test.empty")
    r_src = gguf.GGUFReader(src)
    assert r_src.fields["test.empty"].contents() == [] and r_src.alignment == 64

    report = quantize_model(src, out, "Q8_0", progress=False)
    r = gguf.GGUFReader(out)
    assert r.alignment == 64 and all(t.data_offset % 64 == 0 for t in r.tensors)
    assert bytes(r.fields["test.raw"].parts[-1]) == b"\xff\xfe ok"
    assert int(r.fields["test.empty"].parts[3][0]) == gguf.GGUFValueType.INT32 and r.fields["test.empty"].data == []
    before, after = fields(src), fields(out)
    assert after.pop("general.file_type")[1] == 7 and after.pop("general.quantization_version")[1] == 2
    assert after == before

    types = {t.name: t.tensor_type.name for t in r.tensors}
    # attn_q rows of 96 fit Q8_0; the norm is 1-D; the 3-D expert stack is quantized per row; attn_v is
    # already Q8_0 (copied); attn_k is Q4_0 -> requantized
    assert types == {"blk.0.attn_q.weight": "Q8_0", "blk.0.attn_norm.weight": "F32",
                     "blk.1.ffn_down_exps.weight": "Q8_0", "blk.1.attn_v.weight": "Q8_0", "blk.1.attn_k.weight": "Q8_0"}
    assert [list(t.shape) for t in r.tensors] == [list(t.shape) for t in r_src.tensors]
    actions = {t.name: t.action for t in report.tensors}
    assert actions == {"blk.0.attn_q.weight": "converted", "blk.0.attn_norm.weight": "copied",
                       "blk.1.ffn_down_exps.weight": "converted", "blk.1.attn_v.weight": "copied",
                       "blk.1.attn_k.weight": "requantized"}
    assert report.requantized == ["blk.1.attn_k.weight"] and "requantized" in report.summary()
    src_t, out_t = raw_tensors(src), raw_tensors(out)
    for name in ("blk.1.attn_k.weight", "blk.1.ffn_down_exps.weight", "blk.0.attn_q.weight"):
        s = src_t[name]
        want = ggflow.quantize(ggflow.dequantize(row_bytes(s), s.tensor_type.name), "Q8_0")
        np.testing.assert_array_equal(row_bytes(out_t[name]), want, err_msg=name)


def test_requantizing_a_quantized_model(tiny_model_path, tmp_path):
    out = tmp_path / "q4.gguf"
    report = quantize_model(tiny_model_path("llama", "Q8_0"), out, "Q4_0", progress=False)
    # 2-D matrices of the Q8_0 file become Q4_0 (output.weight: Q6_K -> Q8_0 by fallback, so it's copied)
    assert set(report.requantized) == {t.name for t in report.tensors if t.out_type == "Q4_0"}
    assert len(report.requantized) == 15
    assert next(t for t in report.tensors if t.name == "output.weight").action == "copied"


# -- the output runs ---------------------------------------------------------------------------
def logits(path: Path) -> np.ndarray:
    ctx = Context(Model.load(path), n_ctx=64, type_k="F32", type_v="F32", backends="cpu")
    assert ctx.decode(Batch.from_tokens(TOKENS, all_logits=True)) == DECODE_OK
    return ctx.get_logits().copy()


def rel_rms(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2)))


# Relative RMS error of the logits of 12 tokens. These tiny random models are sensitive: the weights'
# rounding alone, run in F32 (the F32 mix of the quantized file), moves the logits by 1.7% (Q8_0) and
# 16% / 26% (Q4_K_M, llama / qwen3). The quantized file run as it is adds the rounding of activations to
# Q8_0 / Q8_K in the matmuls: measured 1.9% - 2.6% against its own dequantized weights, and 2.7% (Q8_0),
# 16.5% (llama Q4_K_M), 26.5% (qwen3 Q4_K_M) against the F32 model. The bounds leave about 2x room;
# logits of an unrelated model (another seed) are 136% off, and so would a misread block layout be.
@pytest.mark.parametrize("arch, mix, bound", [("llama", "Q8_0", 0.06), ("llama", "Q4_K_M", 0.35),
                                               ("qwen3", "Q4_K_M", 0.5)])
def test_quantized_model_runs_close_to_f32(tiny_model_path, quantized, tmp_path, arch, mix, bound):
    src = tiny_model_path(arch)
    out, _ = quantized(src, mix)
    got = logits(out)
    assert np.isfinite(got).all()
    assert rel_rms(got, logits(src)) < bound
    own_weights = tmp_path / "dequantized.gguf"
    quantize_model(out, own_weights, "F32", progress=False)
    assert rel_rms(got, logits(own_weights)) < 0.05


# -- failures leave OUT alone -------------------------------------------------------------------
def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def failing_quantize(monkeypatch, after: int, exc: BaseException):
    calls = {"n": 0}
    real = qm_convert.quantize

    def quantize(*args, **kw):
        calls["n"] += 1
        if calls["n"] > after:
            raise exc
        return real(*args, **kw)
    monkeypatch.setattr(qm_convert, "quantize", quantize)
    return calls


@pytest.mark.parametrize("exc", [QuantizationError("boom"), KeyboardInterrupt()])
def test_failure_midway_leaves_no_output_and_no_temp_file(tiny_model_path, tmp_path, monkeypatch, exc):
    calls = failing_quantize(monkeypatch, 3, exc)
    out = tmp_path / "out.gguf"
    with pytest.raises(type(exc)):
        quantize_model(tiny_model_path("llama"), out, "Q8_0", progress=False)
    assert calls["n"] == 4  # it did fail midway, after writing some tensors
    assert not out.exists() and leftovers(tmp_path) == []


def test_failure_keeps_an_existing_output_unchanged(tiny_model_path, tmp_path, monkeypatch):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"previous model")
    failing_quantize(monkeypatch, 5, QuantizationError("boom"))
    with pytest.raises(QuantizationError):
        quantize_model(tiny_model_path("llama"), out, "Q4_0", progress=False)
    assert out.read_bytes() == b"previous model" and leftovers(tmp_path) == []


def test_success_replaces_an_existing_output(tiny_model_path, tmp_path):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"previous model")
    quantize_model(tiny_model_path("llama"), out, "Q8_0", progress=False)
    assert gguf.GGUFReader(out).tensors and leftovers(tmp_path) == []


@pytest.mark.parametrize("alias", ["same", "symlink", "hardlink"])
def test_output_never_replaces_the_input(tiny_model_path, tmp_path, alias):
    path = tmp_path / "model.gguf"
    original = Path(tiny_model_path("llama")).read_bytes()
    path.write_bytes(original)
    out = {"same": path, "symlink": tmp_path / "link.gguf", "hardlink": tmp_path / "hard.gguf"}[alias]
    if alias == "symlink":
        out.symlink_to(path)
    elif alias == "hardlink":
        os.link(path, out)
    with pytest.raises(GGFlowError, match="never overwrites its input"):
        quantize_model(path, out, "Q8_0", progress=False)
    assert path.read_bytes() == original and leftovers(tmp_path) == []


def test_truncated_input_is_a_load_error_naming_it(tiny_model_path, tmp_path):
    src, out = tmp_path / "cut.gguf", tmp_path / "out.gguf"
    data = Path(tiny_model_path("llama")).read_bytes()
    src.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        quantize_model(src, out, "Q4_0", progress=False)
    assert not out.exists() and leftovers(tmp_path) == []


def write_one_matrix(path: Path, data: np.ndarray) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_q.weight", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_tensor_type_no_ggml_has_is_a_load_error_naming_it(tmp_path):
    src, out = tmp_path / "odd-type.gguf", tmp_path / "out.gguf"
    write_one_matrix(src, np.ones((4, 64), np.float32))
    raw = bytearray(src.read_bytes())
    # the only tensor info follows the metadata: name, n_dims, ne[2], then its type id
    kv_end = max(end for _, end in GGUFFile(src).kv_spans.values())
    name = b"blk.0.attn_q.weight"
    type_at = kv_end + 8 + len(name) + 4 + 2 * 8
    assert int.from_bytes(raw[type_at:type_at + 4], "little") == gguf.GGMLQuantizationType.F32
    raw[type_at:type_at + 4] = (250).to_bytes(4, "little")
    src.write_bytes(bytes(raw))
    with pytest.raises(ModelLoadError, match=r"odd-type.gguf: tensor 'blk.0.attn_q.weight' has type id 250"):
        quantize_model(src, out, "Q8_0", progress=False)
    assert not out.exists() and leftovers(tmp_path) == []


def test_metadata_entries_are_the_input_bytes(tiny_model_path, quantized):
    src = tiny_model_path("llama")
    out, _ = quantized(src, "Q4_0")
    a, b = GGUFFile(src), GGUFFile(out)
    kept = [k for k in a.kv_spans if k not in ("general.file_type", "general.quantization_version")]
    assert all(b.kv_entry(k) == a.kv_entry(k) for k in kept)
    assert list(b.kv_spans) == kept + ["general.quantization_version", "general.file_type"]


def test_non_finite_weights_name_the_tensor(tmp_path):
    src, out = tmp_path / "nan.gguf", tmp_path / "out.gguf"
    bad = np.ones((4, 64), np.float32)
    bad[2, 5] = np.nan
    write_one_matrix(src, bad)
    with pytest.raises(QuantizationError, match="blk.0.attn_q.weight"):
        quantize_model(src, out, "Q4_0", progress=False)
    assert not out.exists() and leftovers(tmp_path) == []


# Values whose scale (or value) overflows the type to inf: ggml_validate_row_data rejects the rows.
# 1e4 fits Q4_0 (d = 1e4/8 < 65504); 1e30 doesn't. F16's largest finite is 65504.
@pytest.mark.parametrize("mix, value, fits", [("Q4_0", 1e4, True), ("Q4_0", 1e30, False), ("F16", 6e4, True),
                                              ("F16", 1e5, False), ("Q2_K", 1e7, False), ("BF16", 3.4e38, False)])
def test_values_that_overflow_the_type_are_refused_as_llama_cpp_does(tmp_path, mix, value, fits):
    src, out = tmp_path / "big.gguf", tmp_path / "out.gguf"
    data = np.ones((4, 256), np.float32)
    data[1, 3], data[1, 4] = value, -value
    write_one_matrix(src, data)
    if fits:
        quantize_model(src, out, mix, progress=False)
        assert out.exists()
    else:
        with pytest.raises(QuantizationError, match=f"overflow {mix}"):
            quantize_model(src, out, mix, progress=False)
        assert not out.exists() and leftovers(tmp_path) == []


# -- the command --------------------------------------------------------------------------------
def test_cli_quantizes_and_prints_a_summary(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(tiny_model_path("qwen3")), str(out), "q8_0", "-q"]) == 0
    text = capsys.readouterr().out
    assert "Q8_0" in text and "MiB" in text and "F32 " in text and " s" in text
    assert tensor_types(out)["output.weight"] == "Q8_0"


def test_cli_unknown_type_lists_the_valid_ones(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(tiny_model_path("llama")), str(out), "Q7_K"]) == 2
    err = capsys.readouterr().err
    assert "Q7_K" in err and all(m in err for m in MIXES)
    assert not out.exists()


def test_cli_missing_input_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    assert main(["quantize", str(missing), str(tmp_path / "q.gguf"), "Q4_K_M"]) == 2
    assert f"{missing}: no such model file" in capsys.readouterr().err


def test_cli_output_directory_must_exist(tiny_model_path, tmp_path, capsys):
    assert main(["quantize", str(tiny_model_path("llama")), str(tmp_path / "no" / "q.gguf"), "Q4_0"]) == 2
    assert "does not exist" in capsys.readouterr().err
