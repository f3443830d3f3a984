"""LoRA adapters as llama.cpp writes them: logits against transformers + peft, scales, and the refusals.

The reference pair (tests/lora_reference.py) is a tiny random llama and random peft adapters, converted to GGUF
by llama.cpp's own scripts. Compared on CPU in fp32 with an F32 KV cache (an F16 cache rounds K and V, which
peft does not). Tolerance: atol 2e-5 on logits of magnitude ~3: both sides compute in float32 and differ only
in summation order (the dot products, and ggflow adds W x and B (A x) as separate products, peft too); measured
about 1e-6 here.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ggflow.core.batch import Batch
from ggflow.core.context import Context
from ggflow.core.lora import load_lora
from ggflow.core.model import Model
from ggflow.errors import AdapterError, ArgumentError
from tests.data_dir import DATA
from tests.gguf_fuzz import KV, read_image, serialize
from tests.lora_reference import build_lora_pair, convert_adapter, peft_logits

ATOL = 2e-5
TOKENS = [1, 17, 200, 33, 99, 400, 5, 311, 42, 7]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_lora_pair(tmp_path_factory.mktemp("lora"), n_adapters=1, embed_tokens=True)


@pytest.fixture(scope="module")
def model(pair):
    return Model.load(pair.base)


@pytest.fixture(scope="module")
def adapter(pair, model):
    return load_lora(pair.adapters[0], model)


def ggflow_logits(model, adapters=(), scales=(), tokens=TOKENS) -> np.ndarray:
    ctx = Context(model, n_ctx=64, backends="cpu", type_k="F32", type_v="F32")
    if adapters:
        ctx.set_lora(list(adapters), list(scales))
    assert ctx.decode(Batch.from_tokens(tokens, all_logits=True)) == 0
    return ctx.get_logits().copy()


def test_adapter_reads_llama_cpp_fields(adapter, model):
    assert adapter.alpha == 8.0
    # every projection of both layers, the output and the token embedding
    assert len(adapter.pairs) == 2 * 7 + 2
    assert "token_embd.weight" in adapter.pairs and "output.weight" in adapter.pairs
    q = adapter.pairs["blk.0.attn_q.weight"]
    assert q.rank == 4 and q.a.ne[:2] == (64, 4) and q.b.ne[:2] == (4, 64)


def test_base_model_matches_transformers(pair, model):
    np.testing.assert_allclose(ggflow_logits(model), peft_logits(pair, TOKENS, scale=None), atol=ATOL, rtol=0)


@pytest.mark.parametrize("scale", [1.0, 0.5, -2.0])
def test_adapter_logits_match_peft(pair, model, adapter, scale):
    ours = ggflow_logits(model, [adapter], [scale])
    reference = peft_logits(pair, TOKENS, scale=scale)
    base = peft_logits(pair, TOKENS, scale=None)
    assert np.abs(reference - base).max() > 100 * ATOL   # the adapter changes the logits: the check means something
    np.testing.assert_allclose(ours, reference, atol=ATOL, rtol=0)


# an adapter of F16 (or Q8_0) tensors: its products run as ggml's do for such weights (the activations rounded
# to F16, or quantized to Q8_0), so the logits move by about that rounding: measured 1.7e-3 (F16) and 2.7e-2
# (Q8_0) on logits of magnitude ~3
@pytest.mark.parametrize("outtype, atol", [("f16", 5e-3), ("q8_0", 6e-2)])
def test_adapter_of_f16_or_q8_0_tensors_is_close_to_f32(pair, model, adapter, tmp_path, outtype, atol):
    other = load_lora(convert_adapter(pair, outtype, tmp_path / f"adapter-{outtype}.gguf"), model)
    assert other.pairs["blk.0.attn_q.weight"].a.type.name == outtype.upper()
    np.testing.assert_allclose(ggflow_logits(model, [other], [1.0]), ggflow_logits(model, [adapter], [1.0]),
                               atol=atol, rtol=0)


def test_scale_zero_is_the_base_model_bit_for_bit(model, adapter):
    np.testing.assert_array_equal(ggflow_logits(model, [adapter], [0.0]), ggflow_logits(model))


def test_llm_lora_path_and_scale(pair):
    from ggflow.api import LLM

    llm = LLM(str(pair.base), lora_path=str(pair.adapters[0]), lora_scale=0.5, n_ctx=64, type_k="F32", type_v="F32",
              backend="cpu")
    logits, _ = llm.eval_prompt(TOKENS)
    np.testing.assert_allclose(logits, peft_logits(pair, TOKENS, scale=0.5)[-1], atol=ATOL, rtol=0)
    plain = LLM(str(pair.base), n_ctx=64, type_k="F32", type_v="F32", backend="cpu")
    assert np.abs(plain.eval_prompt(TOKENS)[0] - logits).max() > 100 * ATOL


def test_llm_refuses_a_bad_lora_scale(pair):
    from ggflow.api import LLM

    with pytest.raises(ArgumentError, match="lora_scale"):
        LLM(str(pair.base), lora_path=str(pair.adapters[0]), lora_scale=float("nan"), n_ctx=64)


def test_adapter_on_the_vulkan_backend_matches_the_cpu(model, adapter):
    """The low-rank products and the per-row scale run on Vulkan (its binary ops broadcast as ggml's repeat).
    Tolerance 2e-5 as against peft: float32 on both, another summation order (measured 1.3e-6 on llvmpipe)."""
    from tests.vulkan_harness import AVAILABILITY
    if not AVAILABILITY:
        pytest.skip(f"no Vulkan device: {AVAILABILITY.reason}")
    on_cpu = ggflow_logits(model, [adapter], [1.0])
    own = Model.load(model.path)   # a Vulkan context takes its model's weights (and the adapter's) to the device
    ctx = Context(own, n_ctx=64, backends="vulkan", type_k="F32", type_v="F32")
    ctx.set_lora([load_lora(adapter.path, own)], [1.0])
    assert ctx.decode(Batch.from_tokens(TOKENS, all_logits=True)) == 0
    np.testing.assert_allclose(ctx.get_logits(), on_cpu, atol=ATOL, rtol=0)


# -- refusals ---------------------------------------------------------------------------------------
def _rewrite(src, dst, kvs=None, tensors=None):
    img = read_image(src)
    if kvs:
        img.kvs = [replace(kv, value=kvs[kv.key]) if kv.key in kvs else kv for kv in img.kvs]
    if tensors is not None:
        img.tensors = tensors(img.tensors)
    dst.write_bytes(serialize(img))
    return dst


def test_adapter_for_another_model_names_the_first_mismatch(pair):
    other = Model.load(DATA / "models" / "tiny-llama-hs-f32.gguf")   # llama too, n_embd 256 not 64
    from ggflow.core.gguf_file import GGUFFile
    first = next(t.name for t in GGUFFile(pair.adapters[0]).tensors)[: -len(".lora_a")]
    with pytest.raises(AdapterError, match=f"tensor '{first}' does not match the base model"):
        load_lora(pair.adapters[0], other)


def test_adapter_for_another_architecture_is_refused(pair):
    gpt2 = Model.load(DATA / "models" / "tiny-gpt2-hs-f32.gguf")
    with pytest.raises(AdapterError, match="architecture 'llama', the model is 'gpt2'"):
        load_lora(pair.adapters[0], gpt2)


def test_a_model_file_is_not_an_adapter(pair, model):
    with pytest.raises(AdapterError, match="general.type"):
        load_lora(pair.base, model)


def test_wrong_adapter_type_is_refused(pair, model, tmp_path):
    bad = _rewrite(pair.adapters[0], tmp_path / "cvec.gguf", kvs={"adapter.type": "control_vector"})
    with pytest.raises(AdapterError, match="adapter.type is 'control_vector'"):
        load_lora(bad, model)


def test_truncated_adapter_is_refused(pair, model, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(pair.adapters[0].read_bytes()[:-1000])
    with pytest.raises(AdapterError, match="truncated"):
        load_lora(bad, model)


def test_not_a_gguf_file_is_refused(model, tmp_path):
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"not a gguf file at all, just text" * 10)
    with pytest.raises(AdapterError, match="not a GGUF file"):
        load_lora(bad, model)


def test_a_missing_half_of_a_pair_is_refused(pair, model, tmp_path):
    bad = _rewrite(pair.adapters[0], tmp_path / "half.gguf",
                   tensors=lambda ts: [t for t in ts if t.name != "blk.1.ffn_up.weight.lora_b"])
    with pytest.raises(AdapterError, match="'blk.1.ffn_up.weight' has a lora_a but no lora_b"):
        load_lora(bad, model)


def test_a_tensor_the_base_model_lacks_is_refused(pair, model, tmp_path):
    def rename(ts):
        return [replace(t, name=t.name.replace("blk.1.", "blk.9.")) for t in ts]
    bad = _rewrite(pair.adapters[0], tmp_path / "blk9.gguf", tensors=rename)
    with pytest.raises(AdapterError, match="'blk.9.[a-z_.]+' does not exist in the base model"):
        load_lora(bad, model)


def test_a_tensor_of_unexpected_suffix_is_refused(pair, model, tmp_path):
    def rename(ts):
        return [replace(t, name="blk.0.attn_q.weight.lora_x") if t.name == "blk.0.attn_q.weight.lora_a" else t
                for t in ts]
    bad = _rewrite(pair.adapters[0], tmp_path / "suffix.gguf", tensors=rename)
    with pytest.raises(AdapterError, match="neither a .lora_a nor a .lora_b"):
        load_lora(bad, model)


def test_a_transposed_lora_a_is_refused(pair, model, tmp_path):
    def transpose(ts):
        return [replace(t, ne=t.ne[::-1]) if t.name == "blk.0.attn_q.weight.lora_a" else t for t in ts]
    bad = _rewrite(pair.adapters[0], tmp_path / "transposed.gguf", tensors=transpose)
    with pytest.raises(AdapterError, match="'blk.0.attn_q.weight' does not match"):
        load_lora(bad, model)


def test_a_non_string_adapter_type_is_refused(pair, model, tmp_path):
    img = read_image(pair.adapters[0])
    img.kvs = [KV(kv.key, 4, 7) if kv.key == "adapter.type" else kv for kv in img.kvs]   # a uint32
    bad = tmp_path / "typed.gguf"
    bad.write_bytes(serialize(img))
    with pytest.raises(AdapterError, match="adapter.type"):
        load_lora(bad, model)


# -- every architecture: an adapter equals its weights merged into the base -----------------------------
def _write_adapter(path, arch, pairs, alpha):
    """An adapter GGUF as convert_lora_to_gguf.py writes one (gguf-py's writer): pairs {name: (A, B)}, numpy
    row-major, A (rank, n_in) and B (n_out, rank) -- ne [n_in, rank] and [rank, n_out]."""
    gguf = pytest.importorskip("gguf", reason="gguf-py writes the adapter")
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for name, (a, b) in pairs.items():
        writer.add_tensor(f"{name}.lora_a", a)
        writer.add_tensor(f"{name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("name", ["tiny-qwen2-hs-f32.gguf", "tiny-gpt2-hs-f32.gguf", "qwen3moe"])
def test_adapter_equals_its_merged_weights(name, tmp_path):
    """W x + s B (A x) against (W + s B A) x, the merge llama.cpp's export-lora does, on the blocks' matrices
    (gpt2's fused QKV, qwen2's biases) and qwen3moe's stacks of experts (a pair per expert, build_lora_mm_id's
    products). Tolerance 2e-4 on logits of magnitude ~1: float32 with the product reassociated gives 1e-6
    (qwen2); gpt2's GELU rounds its input to F16 for ggml's table, so a last-bit difference can move a value by
    an F16 step (measured 1e-4, and as large with a 25 times smaller adapter: the rounding, not the adapter)."""
    if name == "qwen3moe":
        pytest.importorskip("transformers", reason="the tiny MoE model is made in transformers")
        from tests.fixtures.tiny_moe import write_tiny_moe
        src = tmp_path / "moe.gguf"
        write_tiny_moe(src, "qwen3moe")
    else:
        src = DATA / "models" / name
    rng = np.random.default_rng(0)
    img = read_image(src)
    base = Model.load(src)
    alpha, rank, scale = 16.0, 8, 0.75
    s = np.float32(scale * alpha / rank)
    pairs, data = {}, bytearray(img.data)
    for t in img.tensors:
        # the router is left alone: the same experts are chosen on both sides
        if not t.name.startswith("blk.") or len(t.ne) not in (2, 3) or t.type_id != 0 or "gate_inp" in t.name:
            continue
        n_in, n_out, n_expert = (*t.ne, 1)[:3]
        a = (rng.standard_normal((n_expert, rank, n_in)) * 0.05).astype(np.float32)
        b = (rng.standard_normal((n_expert, n_out, rank)) * 0.05).astype(np.float32)
        pairs[t.name] = (a, b) if len(t.ne) == 3 else (a[0], b[0])
        w = np.frombuffer(data, np.float32, n_in * n_out * n_expert, t.offset).reshape(n_expert, n_out, n_in)
        merged = (w + s * (b @ a)).astype(np.float32)
        data[t.offset:t.offset + merged.nbytes] = merged.tobytes()
    merged_path = tmp_path / "merged.gguf"
    merged_path.write_bytes(serialize(replace(img, data=bytes(data))))
    adapter = load_lora(_write_adapter(tmp_path / "adapter.gguf", img.arch, pairs, alpha), base)
    if name == "qwen3moe":
        assert adapter.pairs["blk.0.ffn_up_exps.weight"].a.n_dims == 3
    tokens = [t % base.hparams.n_vocab for t in TOKENS]
    ours = ggflow_logits(base, [adapter], [scale], tokens)
    reference = ggflow_logits(Model.load(merged_path), tokens=tokens)
    assert np.abs(reference - ggflow_logits(base, tokens=tokens)).max() > 0.05   # the adapter does something
    np.testing.assert_allclose(ours, reference, atol=2e-4, rtol=0)
