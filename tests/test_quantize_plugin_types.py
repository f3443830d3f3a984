"""ggflow quantize to tensor types a plugin registers, and llama-quantize's per-tensor overrides
(--tensor-type PATTERN=TYPE, --output-tensor-type, --token-embedding-type).

The plugin types are WIDE_TEST and ODD24_TEST, registered through the plugin manager as a third-party
plugin would be. TQ2_0 (ggml's ternary format: 256 elements in 64 bytes of 2-bit codes and an fp16 scale)
was the plugin type here until ggflow built it in (ggflow/quant_builtin/ternary.py); its numpy codec stays
below as an independent reference that the built-in must equal, and the tests that wrote TQ2_0 files now
write the built-in type (with --pure where they meant "every matrix in the type"). gguf-py has an
independent TQ2_0 decoder and GGUFReader knows the type id, so the outputs are read and decoded without ggflow.
The expected types follow llama.cpp's llama_tensor_get_type and tensor_type_fallback (src/llama-quant.cpp).
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import ggflow
from ggflow.cli import main
from ggflow.core.types import TypeTraits
from ggflow.errors import ArgumentError, QuantizationError, UnknownNameError
from ggflow.plugins import hookimpl
from ggflow.plugins.manager import get_plugin_manager
from ggflow.quantize_model import quantize_model
from ggflow.quantize_model.mixes import MIXES, ModelFacts, TensorDesc, choose_types, fallback_type, find_mix
from ggflow.quantize_model.overrides import make_overrides
from tests.data_dir import DATA

SHARED_MODELS = DATA / "models"
TINY_LLAMA = SHARED_MODELS / "tiny-llama-hs-f32.gguf"   # 256 wide, 4 layers, n_ff 768, separate output
TINY_QWEN2 = SHARED_MODELS / "tiny-qwen2-hs-f32.gguf"   # tied output


# -- the plugin type: TQ2_0 in numpy, as ggml's quantize_row_tq2_0_ref / dequantize_row_tq2_0 ----------
QK = 256


def tq2_0_from_float(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    amax = np.abs(blocks).max(axis=1)
    inv = np.where(amax > 0, np.float32(1) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    v = blocks * inv[:, None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int32) + 1   # lroundf: -1, 0, 1 -> 0, 1, 2
    # byte m of each 128-element half holds elements m, m+32, m+64, m+96 in bits 0-1, 2-3, 4-5, 6-7
    q = q.reshape(n, 2, 4, 32) << (2 * np.arange(4)).reshape(1, 1, 4, 1)
    qs = q.sum(axis=2).astype(np.uint8).reshape(n, 64)
    return np.concatenate([qs, amax.astype(np.float16).view(np.uint8).reshape(n, 2)], axis=1)


def tq2_0_to_float(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    qs = blocks[:, :64].reshape(n, 2, 1, 32)
    q = (qs >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    d = blocks[:, 64:66].copy().view(np.float16).astype(np.float32)
    return (q.reshape(n, QK).astype(np.float32) - 1) * d


# The reference codec as traits, not registered (ggflow registers its own TQ2_0).
TQ2_0 = TypeTraits("TQ2_0", int(gguf.GGMLQuantizationType.TQ2_0), QK, 66, tq2_0_to_float, tq2_0_from_float, "Q8_K")
# A plugin type with blocks of 256 that llama.cpp has no fallback for, and one with blocks of 24 (no
# smaller block to step down to): ids no ggml type uses.
WIDE = TypeTraits("WIDE_TEST", 9101, 256, 256 * 4, lambda b: b.copy().view(np.float32).reshape(-1, 256),
                  lambda b: np.ascontiguousarray(b, np.float32).view(np.uint8), "F32")
ODD = TypeTraits("ODD24_TEST", 9102, 24, 24 * 4, lambda b: b.copy().view(np.float32).reshape(-1, 24),
                 lambda b: np.ascontiguousarray(b, np.float32).view(np.uint8), "F32")


class _TernaryPlugin:
    @hookimpl
    def register_quant_types(self, register):
        register(WIDE)
        register(ODD)


@pytest.fixture(scope="module", autouse=True)
def ternary_plugin():
    manager, plugin = get_plugin_manager(), _TernaryPlugin()
    manager.register(plugin)
    try:
        yield
    finally:
        manager.unregister(plugin)


def shared(path: Path) -> Path:
    assert path.exists(), f"{path} is missing from tests/data"
    return path


def readers(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def floats_of(t: gguf.ReaderTensor) -> np.ndarray:
    """A tensor's values, decoded by gguf-py (not ggflow), as [rows, row length]."""
    ne = [int(n) for n in t.shape]
    data = np.asarray(t.data)
    if t.tensor_type != gguf.GGMLQuantizationType.F32:
        data = gguf.quants.dequantize(data.view(np.uint8), t.tensor_type)
    return np.asarray(data, np.float32).reshape(-1, ne[0])


def test_the_built_in_tq2_0_is_the_test_codec_and_ggml_s():
    # the built-in writes the reference codec's bytes; gguf-py decodes them to the values both decoders give
    x = np.random.default_rng(0).standard_normal((6, 2 * QK)).astype(np.float32)
    x[1] = 0
    q = ggflow.quantize(x, TQ2_0)
    np.testing.assert_array_equal(ggflow.quantize(x, "TQ2_0"), q)
    np.testing.assert_array_equal(ggflow.dequantize(q, "TQ2_0"), ggflow.dequantize(q, TQ2_0))
    np.testing.assert_array_equal(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.TQ2_0), ggflow.dequantize(q, TQ2_0))
    deq = ggflow.dequantize(q, TQ2_0).reshape(-1, QK)
    amax = np.abs(x.reshape(-1, QK)).max(axis=1, keepdims=True).astype(np.float16).astype(np.float32)
    assert np.all(np.isin(deq / np.where(amax == 0, 1, amax), [-1, 0, 1]))  # ternary times the block's scale
    assert np.all(np.abs(deq - x.reshape(-1, QK)) <= amax / 2 + 1e-3)


# -- every matrix in one type (TQ2_0 --pure) --------------------------------------------------------
@pytest.fixture(scope="module")
def llama_tq2(tmp_path_factory):
    out = tmp_path_factory.mktemp("tq2") / "tiny-llama-TQ2_0.gguf"
    report = quantize_model(shared(TINY_LLAMA), out, "tq2_0", pure=True, progress=False)
    return out, report


def test_plain_plugin_type_types_every_matrix_and_keeps_norms_f32(llama_tq2):
    out, report = llama_tq2
    src, dst = readers(TINY_LLAMA), readers(out)
    assert list(src) == list(dst)
    for name, t in dst.items():
        matrix = len(src[name].shape) == 2 and not name.endswith("_norm.weight")
        want = gguf.GGMLQuantizationType.TQ2_0 if matrix else gguf.GGMLQuantizationType.F32
        assert t.tensor_type == want, name
    assert any(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in dst.values())  # the norms
    assert report.mix == "TQ2_0" and not report.fallbacks
    assert report.type_counts["TQ2_0"] == sum(len(t.shape) == 2 for t in src.values())


def test_plain_plugin_type_values_are_the_plugin_codec_round_trip(llama_tq2):
    out, _ = llama_tq2
    src, dst = readers(TINY_LLAMA), readers(out)
    for name, t in dst.items():
        x = floats_of(src[name])
        want = x if t.tensor_type == gguf.GGMLQuantizationType.F32 else tq2_0_to_float(
            tq2_0_from_float(x.reshape(-1, QK))).reshape(x.shape)
        np.testing.assert_array_equal(floats_of(t), want, err_msg=name)


def test_file_type_is_llama_cpp_s_for_the_type(llama_tq2):
    fields = gguf.GGUFReader(llama_tq2[0]).fields
    assert fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_TQ2_0


def test_a_type_llama_cpp_has_no_file_type_for_writes_none(tmp_path):
    out = tmp_path / "q8k.gguf"
    report = quantize_model(shared(TINY_LLAMA), out, "Q8_K", progress=False)
    assert report.ftype is None and "no general.file_type" in report.summary()
    r = gguf.GGUFReader(out)
    assert "general.file_type" not in r.fields and "general.quantization_version" in r.fields
    assert readers(out)["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_K


def test_plain_built_in_type_names_that_are_mixes_stay_mixes():
    assert find_mix("Q6_K") is MIXES["Q6_K"] and find_mix("q4_k") is MIXES["Q4_K_M"]
    mix = find_mix("tq2_0")   # llama-quantize's TQ2_0 mix (LLAMA_FTYPE_MOSTLY_TQ2_0), with its rules
    assert mix is MIXES["TQ2_0"] and (mix.ftype, mix.base_type, mix.rules) == (37, "TQ2_0", True)
    plain = find_mix("wide_test")   # a plugin type that is no mix: every tensor in it, no rules
    assert (plain.name, plain.base_type, plain.rules) == ("WIDE_TEST", "WIDE_TEST", False)
    with pytest.raises(UnknownNameError):
        find_mix("I32")  # token ids, not a weight type


# -- fallback -----------------------------------------------------------------------------------
def test_rows_that_do_not_fit_a_plugin_type_fall_back_as_llama_cpp_does(tiny_model_path, tmp_path):
    # the 128-wide tiny llama: TQ2_0 (256-element blocks) -> Q4_0 for rows of 128; ffn_down's rows are 256
    out = tmp_path / "tq2-128.gguf"
    report = quantize_model(tiny_model_path("llama"), out, "TQ2_0", pure=True, progress=False)
    types = {n: t.tensor_type.name for n, t in readers(out).items()}
    assert types["blk.0.ffn_down.weight"] == types["blk.1.ffn_down.weight"] == "TQ2_0"
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == types["output.weight"] == "Q4_0"
    assert {t.fallback_from for t in report.fallbacks} == {"TQ2_0"}
    assert len(report.fallbacks) == sum(1 for n, t in types.items() if t == "Q4_0")


def test_plugin_type_with_no_fallback_is_an_error_naming_the_tensor(tiny_model_path, tmp_path):
    out = tmp_path / "wide.gguf"
    with pytest.raises(QuantizationError, match=r"tensor '.*': rows of 128 .*WIDE_TEST's block of 256.*no fallback"):
        quantize_model(tiny_model_path("llama"), out, "WIDE_TEST", progress=False)
    assert not out.exists()


def test_small_block_plugin_type_falls_back_to_f16():
    assert fallback_type(128, "ODD24_TEST") == "F16"   # no smaller block: F16, as llama.cpp
    assert fallback_type(96, "ODD24_TEST") == "ODD24_TEST"


# -- --tensor-type, --output-tensor-type, --token-embedding-type ----------------------------------
def test_overrides_change_only_the_tensors_they_name(tmp_path):
    src = shared(TINY_LLAMA)
    plain, over = tmp_path / "plain.gguf", tmp_path / "over.gguf"
    quantize_model(src, plain, "Q4_K_M", progress=False)
    quantize_model(src, over, "Q4_K_M", progress=False,
                   tensor_types={r"blk\.[01]\.ffn_(up|gate)": "TQ2_0", "attn_k": "Q8_0", "ffn": "F16"},
                   output_tensor_type="TQ2_0", token_embedding_type="q5_0")
    a, b, inputs = readers(plain), readers(over), readers(src)
    want = {n: t.tensor_type.name for n, t in a.items()}
    for il in range(4):
        want[f"blk.{il}.attn_k.weight"] = "Q8_0"
        for m in ("ffn_up", "ffn_gate", "ffn_down"):
            want[f"blk.{il}.{m}.weight"] = "TQ2_0" if il < 2 and m != "ffn_down" else "F16"  # the first match wins
    want["output.weight"], want["token_embd.weight"] = "TQ2_0", "Q5_0"
    assert {n: t.tensor_type.name for n, t in b.items()} == want
    # each tensor holds its type's encoding of the input: decoded by gguf-py, against ggflow's or the codec's round trip
    for name, t in b.items():
        x = floats_of(inputs[name])
        kind = t.tensor_type.name
        deq = (tq2_0_to_float(tq2_0_from_float(x.reshape(-1, QK))).reshape(x.shape) if kind == "TQ2_0"
               else ggflow.dequantize(ggflow.quantize(x, kind), kind))
        np.testing.assert_array_equal(floats_of(t), deq, err_msg=name)


def test_cli_takes_the_overrides(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    rc = main(["quantize", str(shared(TINY_LLAMA)), str(out), "TQ2_0", "-q", "--tensor-type", "attn_v=Q8_0",
               "--tensor-type", "BLK\\.3\\.=q4_0", "--output-tensor-type", "Q6_K", "--token-embedding-type", "F16"])
    assert rc == 0
    assert "TQ2_0" in capsys.readouterr().out
    types = {n: t.tensor_type.name for n, t in readers(out).items()}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "F16"
    assert types["blk.0.attn_v.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "TQ2_0"
    assert types["blk.3.attn_v.weight"] == "Q8_0"  # attn_v came first
    assert types["blk.3.attn_q.weight"] == types["blk.3.ffn_down.weight"] == "Q4_0"  # matched ignoring case
    assert types["blk.3.attn_norm.weight"] == "F32"  # never quantized, whatever the patterns say


def llama_descs(n_layer: int, n_embd: int = 256, tied: bool = False) -> list[TensorDesc]:
    ts = [TensorDesc("token_embd.weight", (n_embd, 1000), "F32")]
    if not tied:
        ts.append(TensorDesc("output.weight", (n_embd, 1000), "F32"))
    for il in range(n_layer):
        ts += [TensorDesc(f"blk.{il}.{m}.weight", (n_embd, n_embd), "F32") for m in ("attn_q", "attn_v", "ffn_down")]
    return ts


def chosen(ts, mix, pure=False, facts=ModelFacts("llama", 8, 8, 8), **overrides):
    return {n: c.type_name for n, c in choose_types(ts, find_mix(mix), facts, pure, make_overrides(**overrides)).items()}


def test_a_manual_attn_v_does_not_advance_llama_cpp_s_v_counter():
    # Q4_K_M promotes attn_v where use_more_bits(i_attention_wv, 8): counts 0, 3, 6, 7. The counter
    # advances only in the mix's rules, so with blk.0's V typed by hand blk.1's V is count 0 (promoted).
    ts = llama_descs(8)
    plain = chosen(ts, "Q4_K_M")
    assert [plain[f"blk.{i}.attn_v.weight"] for i in range(8)] == ["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K",
                                                                   "Q6_K", "Q6_K"]
    manual = chosen(ts, "Q4_K_M", tensor_types={r"blk\.0\.attn_v": "Q8_0"})
    assert [manual[f"blk.{i}.attn_v.weight"] for i in range(8)] == ["Q8_0", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K",
                                                                    "Q4_K", "Q6_K"]


def test_tied_embeddings_take_the_output_type_unless_pure_or_token_embedding_type():
    ts = llama_descs(2, tied=True)
    assert chosen(ts, "Q4_K_M", output_tensor_type="Q5_0")["token_embd.weight"] == "Q5_0"
    assert chosen(ts, "Q4_K_M", pure=True, output_tensor_type="Q5_0")["token_embd.weight"] == "Q4_K"
    assert chosen(ts, "Q4_K_M", output_tensor_type="Q5_0", token_embedding_type="Q8_0")["token_embd.weight"] == "Q8_0"


def test_pure_keeps_the_output_and_embedding_overrides():
    t = chosen(llama_descs(2), "Q4_K_M", pure=True, output_tensor_type="Q8_0", token_embedding_type="F16")
    assert (t["output.weight"], t["token_embd.weight"], t["blk.1.attn_v.weight"]) == ("Q8_0", "F16", "Q4_K")


def test_a_tensor_type_override_gets_the_fallback_too():
    ts = llama_descs(2, n_embd=128)
    t = {n: c for n, c in choose_types(ts, find_mix("Q8_0"), ModelFacts("llama", 2, 8, 8), False,
                                       make_overrides({"attn_q": "Q4_K"})).items()}
    assert t["blk.0.attn_q.weight"].type_name == "Q5_0" and t["blk.0.attn_q.weight"].fallback_from == "Q4_K"


def test_float_mixes_take_tensor_type_overrides():
    # llama-quantize ignores --tensor-type when TYPE is F32/F16/BF16; ggflow applies it (docs/quantization.md)
    t = chosen(llama_descs(2), "F16", tensor_types=["attn_q=Q8_0"])
    assert t["blk.0.attn_q.weight"] == "Q8_0" and t["blk.0.attn_v.weight"] == "F16"


def test_an_output_type_that_does_not_fit_the_rows_is_a_clear_error():
    with pytest.raises(QuantizationError, match=r"token_embedding_type=Q4_K: tensor 'token_embd.weight' has rows of 128"):
        chosen(llama_descs(2, n_embd=128), "Q8_0", token_embedding_type="Q4_K")


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("tensor_types, error, message", [
    (["attn_v"], ArgumentError, "'PATTERN=TYPE'.*no '='"),
    (["=Q8_0"], ArgumentError, "PATTERN before the '='"),
    (["attn_v="], ArgumentError, "TYPE after the '='"),
    (["blk.(0=Q8_0"], ArgumentError, "valid regular expression"),
    ({"attn_v": "Q9_0"}, UnknownNameError, "unknown tensor type 'Q9_0' in tensor_types attn_v=Q9_0.*TQ2_0"),
    (["attn_v=Q4_K_M"], UnknownNameError, "unknown tensor type 'Q4_K_M'"),  # a mix is no tensor type
    ([("attn_v",)], ArgumentError, "PATTERN, TYPE"),
])
def test_bad_tensor_types_are_clear_errors(tmp_path, tensor_types, error, message):
    out = tmp_path / "bad.gguf"
    with pytest.raises(error, match=message):
        quantize_model(shared(TINY_LLAMA), out, "Q8_0", progress=False, tensor_types=tensor_types)
    assert not out.exists()


def test_unknown_output_tensor_type_names_the_option():
    with pytest.raises(UnknownNameError, match="unknown tensor type 'Q7' in output_tensor_type"):
        make_overrides(output_tensor_type="Q7")


def test_cli_unknown_type_lists_mixes_and_plugin_types(tmp_path, capsys):
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(shared(TINY_LLAMA)), str(out), "TQ3_0"]) == 2
    err = capsys.readouterr().err
    assert "'TQ3_0'" in err and all(m in err for m in MIXES) and "TQ2_0" in err and "WIDE_TEST" in err
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--tensor-type", "attn_v"], "no '='"),
    (["--tensor-type", "attn_[v=Q8_0"], "valid regular expression"),
    (["--tensor-type", "attn_v=Q9_9"], "unknown tensor type 'Q9_9'"),
    (["--token-embedding-type", "Q9_9"], "unknown tensor type 'Q9_9' in token_embedding_type"),
])
def test_cli_bad_overrides_are_clear_errors(tmp_path, capsys, args, message):
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(shared(TINY_LLAMA)), str(out), "Q8_0", "-q", *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
