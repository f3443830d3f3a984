"""ggflow quantize --imatrix FILE: importance weights reach the encoders, the mixes see has_imatrix, and an
imatrix for another model is refused naming the first mismatch (llama-quantize's load_imatrix and
llama_model_quantize_impl, tools/quantize/quantize.cpp and src/llama-quant.cpp).

The weighted encoders' bytes against ggml's own are tested in test_quant_iquants.py (golden rows with
importance weights); here each tensor's bytes must be the encoder's with that tensor's weights (its
sums / count from the file), so the right weights reach the right tensor, expert by expert.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import ggflow
from ggflow.cli import main
from ggflow.errors import ImatrixError, QuantizationError
from ggflow.imatrix import Entry, Imatrix, compute_imatrix, read_imatrix, write_dat, write_gguf
from ggflow.quantize_model import quantize_model
from tests.fixtures import tiny_models
from tests.fixtures.tiny_models import TinySpec, write_tiny_model

TEXT = " ".join(f"the {w} fox jumps over {n} lazy dogs near the river bank" for n in range(40)
                for w in ("quick", "brown"))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny qwen3 (rows of 256) and its imatrix."""
    root = tmp_path_factory.mktemp("qimatrix")
    model = write_tiny_model(root / "qwen3.gguf", "qwen3", "F32", seed=2)
    path = root / "imatrix.gguf"
    write_gguf(path, compute_imatrix(model, TEXT, n_ctx=32, n_chunks=2, dataset="text.txt", backends="cpu"))
    return model, path


def tensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    return {t.name: (t.tensor_type.name, np.asarray(t.data)) for t in gguf.GGUFReader(path).tensors}


def test_each_tensor_is_quantized_with_its_own_weights(qwen3, tmp_path):
    model, imatrix = qwen3
    out = tmp_path / "iq4.gguf"
    report = quantize_model(model, out, "IQ4_XS", pure=True, progress=False, imatrix=imatrix)
    m, src, got = read_imatrix(imatrix), tensors(model), tensors(out)
    weighted = [t.name for t in report.tensors if t.weighted]
    assert set(weighted) == set(m.entries)              # every blk.* matrix; token_embd / output have none
    for name in weighted:
        x = src[name][1]
        want = ggflow.quantize(x, "IQ4_XS", m.importance(name))
        assert got[name][0] == "IQ4_XS"
        np.testing.assert_array_equal(got[name][1].reshape(want.shape), want, err_msg=name)
        assert not np.array_equal(want, ggflow.quantize(x, "IQ4_XS")), "the weights change nothing: a weak test"
    assert sorted(t.name for t in report.tensors if t.weighted is False) == ["output.weight", "token_embd.weight"]


def test_metadata_records_the_imatrix_as_llama_quantize_does(qwen3, tmp_path):
    model, imatrix = qwen3
    out = tmp_path / "iq4.gguf"
    quantize_model(model, out, "IQ4_NL", progress=False, imatrix=imatrix)
    fields = gguf.GGUFReader(out).fields
    keys = [k for k in fields if not k.startswith("GGUF.")]
    assert keys[-5:] == ["general.file_type", "quantize.imatrix.file", "quantize.imatrix.dataset",
                         "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"]
    assert fields["quantize.imatrix.file"].contents() == str(imatrix)
    assert fields["quantize.imatrix.dataset"].contents() == "text.txt"
    assert fields["quantize.imatrix.entries_count"].types == [gguf.GGUFValueType.UINT32]
    assert fields["quantize.imatrix.entries_count"].contents() == len(read_imatrix(imatrix).entries)
    assert fields["quantize.imatrix.chunks_count"].contents() == 2


def test_the_mixes_rules_see_the_imatrix(tmp_path, monkeypatch):
    """IQ4_XS: without an imatrix the first n_layer/8 ffn_down get Q5_K; with one they stay IQ4_XS
    (llama_tensor_get_type: `!qs.has_imatrix`). An 8-layer 256-wide llama has one such layer."""
    monkeypatch.setitem(tiny_models.SPECS, "llama", TinySpec("llama", 256, 4, 4, 8, 256, 256))
    model = write_tiny_model(tmp_path / "llama8.gguf", "llama", "F32", seed=1)
    imatrix = tmp_path / "im.gguf"
    write_gguf(imatrix, compute_imatrix(model, TEXT, n_ctx=16, n_chunks=2, dataset="t", backends="cpu"))
    plain = quantize_model(model, tmp_path / "a.gguf", "IQ4_XS", progress=False)
    weighted = quantize_model(model, tmp_path / "b.gguf", "IQ4_XS", progress=False, imatrix=imatrix)
    types = [{t.name: t.out_type for t in r.tensors} for r in (plain, weighted)]
    assert types[0]["blk.0.ffn_down.weight"] == "Q5_K" and types[1]["blk.0.ffn_down.weight"] == "IQ4_XS"
    assert {n for n in types[0] if types[0][n] != types[1][n]} == {"blk.0.ffn_down.weight"}


def test_low_bit_mixes_pass_the_refusal_with_an_imatrix(qwen3, tmp_path):
    """IQ2_XXS: refused without an imatrix; with one it is written (each IQ2_XXS tensor with its weights) and
    runs within 5% of its own weights in F32. IQ1_M passes the refusal too, and stops at its missing encoder."""
    from tests.test_quant_iq_e2e import logits, rel_rms
    model, imatrix = qwen3
    with pytest.raises(QuantizationError, match="requires an importance matrix"):
        quantize_model(model, tmp_path / "x.gguf", "IQ2_XXS", progress=False)
    out = tmp_path / "iq2xxs.gguf"
    report = quantize_model(model, out, "IQ2_XXS", progress=False, imatrix=imatrix)
    assert report.type_counts["IQ2_XXS"] > 0
    m, src, got = read_imatrix(imatrix), tensors(model), tensors(out)
    for name in (n for n, (t, _) in got.items() if t == "IQ2_XXS"):
        want = ggflow.quantize(src[name][1], "IQ2_XXS", m.importance(name))
        np.testing.assert_array_equal(got[name][1].reshape(want.shape), want)
    own = tmp_path / "own.gguf"
    quantize_model(out, own, "F32", progress=False)
    assert rel_rms(logits(out), logits(own)) < 0.05
    with pytest.raises(QuantizationError, match="can read but not write yet"):
        quantize_model(model, tmp_path / "x.gguf", "IQ1_M", progress=False, imatrix=imatrix)


def test_an_imatrix_for_another_model_is_refused_naming_the_first_mismatch(qwen3, tmp_path):
    model, imatrix = qwen3
    m = read_imatrix(imatrix)
    other = tmp_path / "other.gguf"
    m.entries["blk.7.attn_q.weight"] = m.entries["blk.0.attn_q.weight"]
    write_gguf(other, m)
    with pytest.raises(ImatrixError, match="'blk.7.attn_q.weight', which the model does not have"):
        quantize_model(model, tmp_path / "x.gguf", "IQ4_XS", progress=False, imatrix=other)
    m = read_imatrix(imatrix)
    m.entries["blk.1.ffn_up.weight"] = Entry(np.ones((1, 128), np.float32), np.array([64]))
    write_gguf(other, m)
    with pytest.raises(ImatrixError, match="imatrix size 128 is different from tensor size 256 for blk.1.ffn_up"):
        quantize_model(model, tmp_path / "x.gguf", "IQ4_XS", progress=False, imatrix=other)
    assert not (tmp_path / "x.gguf").exists()


def test_bad_imatrix_files_are_refused(qwen3, tmp_path):
    model, imatrix = qwen3
    m = read_imatrix(imatrix)
    bad = tmp_path / "nan.gguf"
    m.entries["blk.0.ffn_up.weight"].sums[0, 3] = np.nan
    write_gguf(bad, m)
    with pytest.raises(ImatrixError, match="non-finite values"):
        quantize_model(model, tmp_path / "x.gguf", "IQ4_XS", progress=False, imatrix=bad)
    bare = tmp_path / "bare.gguf"
    w = gguf.GGUFWriter(str(bare), "")
    w.add_tensor("blk.0.ffn_up.weight.in_sum2", np.ones((1, 256), np.float32))
    w.add_tensor("blk.0.ffn_up.weight.counts", np.ones((1, 1), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ImatrixError, match="missing imatrix metadata"):
        quantize_model(model, tmp_path / "x.gguf", "IQ4_XS", progress=False, imatrix=bare)
    with pytest.raises(ImatrixError, match="no such imatrix file"):
        quantize_model(model, tmp_path / "x.gguf", "IQ4_XS", progress=False, imatrix=tmp_path / "none.gguf")


def test_legacy_dat_and_the_cli(qwen3, tmp_path, capsys):
    model, imatrix = qwen3
    dat = tmp_path / "im.dat"
    write_dat(dat, read_imatrix(imatrix))
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(model), str(out), "Q4_K_M", "--imatrix", str(dat), "-q"]) == 0
    text = capsys.readouterr().out
    assert f"imatrix:   {dat}: importance weights used for 14 tensor(s)" in text
    assert "2 tensor(s) quantized without importance weights" in text   # token_embd and output: no entry
    m, src, got = read_imatrix(dat), tensors(model), tensors(out)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight"):   # Q4_K and Q6_K in this mix
        want = ggflow.quantize(src[name][1], got[name][0], m.importance(name))
        np.testing.assert_array_equal(got[name][1].reshape(want.shape), want)
    assert gguf.GGUFReader(out).fields["quantize.imatrix.entries_count"].contents() == 14
    assert main(["quantize", str(model), str(tmp_path / "y.gguf"), "IQ4_XS", "--imatrix",
                 str(tmp_path / "missing.dat"), "-q"]) == 2
    assert "no such imatrix file" in capsys.readouterr().err


def test_types_without_a_weighted_encoder_are_reported(qwen3, tmp_path):
    """Every built-in type llama-quantize weighs now has its weighted encoder; a type without one (Q8_K here,
    a plugin's type likewise) is quantized without the weights, and the report names each such tensor."""
    model, imatrix = qwen3
    report = quantize_model(model, tmp_path / "q2k.gguf", "Q2_K", progress=False, imatrix=imatrix,
                            tensor_types={"attn_q": "Q8_K"})
    unweighted = {t.name for t in report.tensors if t.weighted is False}
    assert unweighted == {"blk.0.attn_q.weight", "blk.1.attn_q.weight", "output.weight", "token_embd.weight"}
    assert "blk.0.attn_q.weight (Q8_K)" in report.summary()


def test_experts_get_their_own_weights(tmp_path):
    from tests.fixtures.tiny_moe import N_EXPERT, write_tiny_moe
    model = tmp_path / "moe.gguf"
    write_tiny_moe(model, "qwen3moe")
    m = compute_imatrix(model, TEXT, n_ctx=32, n_chunks=2, dataset="t", backends="cpu")
    imatrix = tmp_path / "im.gguf"
    write_gguf(imatrix, m)
    out = tmp_path / "moe-iq4nl.gguf"
    quantize_model(model, out, "IQ4_NL", pure=True, progress=False, imatrix=imatrix)
    src, got = tensors(model), tensors(out)
    name = "blk.0.ffn_up_exps.weight"
    w = m.importance(name).reshape(N_EXPERT, -1)
    x = src[name][1]                                      # (n_expert, rows, cols)
    want = np.stack([ggflow.quantize(x[e], "IQ4_NL", w[e]) for e in range(N_EXPERT)])
    np.testing.assert_array_equal(got[name][1].reshape(want.shape), want)


def test_the_iq3_xs_mix_needs_and_uses_the_imatrix(qwen3, tmp_path):
    """IQ3_XS writes IQ3_XXS tensors (attn_q/k, the middle ffn_up/gate), which llama.cpp writes only with an
    imatrix: refused without one; with one each IQ3_XXS tensor has its own weights, and the model runs within
    5% of its own weights in F32 (measured 0.7%: the Q6_K output's Q8_K activations) and 0.9 of the F32
    model (0.56; 3.1-3.4 bits per weight on a random tiny model)."""
    from tests.test_quant_iq_e2e import logits, rel_rms
    model, imatrix = qwen3
    with pytest.raises(QuantizationError, match="requires an importance matrix"):
        quantize_model(model, tmp_path / "x.gguf", "IQ3_XS", progress=False)
    out = tmp_path / "iq3xs.gguf"
    report = quantize_model(model, out, "IQ3_XS", progress=False, imatrix=imatrix)
    assert report.type_counts == {"IQ3_S": 9, "F32": 9, "IQ3_XXS": 6, "Q6_K": 1}
    m, src, got = read_imatrix(imatrix), tensors(model), tensors(out)
    name = "blk.1.attn_k.weight"
    assert got[name][0] == "IQ3_XXS"
    np.testing.assert_array_equal(got[name][1].reshape(-1), ggflow.quantize(src[name][1], "IQ3_XXS",
                                                                             m.importance(name)).reshape(-1))
    own = tmp_path / "own.gguf"
    quantize_model(out, own, "F32", progress=False)
    y = logits(out)
    assert rel_rms(y, logits(own)) < 0.05 and rel_rms(y, logits(model)) < 0.9


@pytest.mark.parametrize("mix", ["IQ2_M", "IQ3_XXS", "IQ1_S"])
def test_more_low_bit_mixes_run_with_an_imatrix(qwen3, tmp_path, mix):
    """IQ2_M (IQ2_S, IQ3_S token embeddings), IQ3_XXS (IQ2_S attn_q/k) and IQ1_S: written with the imatrix, and the
    model runs within 5% of its own weights in F32 (the K-quant tensors' Q8_K activations, as above)."""
    from tests.test_quant_iq_e2e import logits, rel_rms
    model, imatrix = qwen3
    out = tmp_path / f"{mix}.gguf"
    report = quantize_model(model, out, mix, progress=False, imatrix=imatrix)
    assert ("IQ1_S" if mix == "IQ1_S" else "IQ2_S") in report.type_counts
    own = tmp_path / "own.gguf"
    quantize_model(out, own, "F32", progress=False)
    assert rel_rms(logits(out), logits(own)) < 0.05
