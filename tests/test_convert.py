"""``ggflow convert``: what it writes (tensor types per outtype, the keys an encoder needs) and what it
refuses (an unknown architecture with the supported list, missing files, bad options), never leaving a
half-written file behind."""
from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch", reason="torch is needed to build the tiny model: pip install torch==2.13.0")
pytest.importorskip("transformers", reason="transformers is needed to build the tiny model")

from ggflow.cli import main  # noqa: E402
from ggflow.convert import ConvertError, convert, supported_architectures  # noqa: E402
from ggflow.core.gguf_file import GGUFFile  # noqa: E402
from tests.fixtures.tiny_bert import make_tiny_bert  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("convert") / "hf"
    make_tiny_bert(d)
    return d


def copy_without(hf_dir, tmp_path, *names):
    d = tmp_path / "hf"
    shutil.copytree(hf_dir, d)
    for n in names:
        (d / n).unlink()
    return d


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".part"))


def test_q8_0_quantizes_matrices_and_keeps_norms_biases_positions_in_f32(hf_dir, tmp_path):
    out = tmp_path / "m.gguf"
    convert(hf_dir, out, "q8_0", progress=False)
    types = {t.name: t.type_id for t in GGUFFile(out).tensors}
    assert types["blk.0.attn_q.weight"] == 8 and types["token_embd.weight"] == 8            # Q8_0
    assert types["blk.0.attn_q.bias"] == types["blk.0.attn_output_norm.weight"] == 0       # F32
    assert types["position_embd.weight"] == types["token_types.weight"] == 0
    f16 = tmp_path / "h.gguf"
    convert(hf_dir, f16, "f16", progress=False)
    assert {t.name: t.type_id for t in GGUFFile(f16).tensors}["blk.1.ffn_up.weight"] == 1    # F16


def test_encoder_keys(hf_dir, tmp_path):
    out = tmp_path / "m.gguf"
    convert(hf_dir, out, "f32", progress=False)
    f = GGUFFile(out).fields
    assert f["general.architecture"] == "bert" and f["bert.attention.causal"] is False
    assert f["tokenizer.ggml.model"] == "bert" and f["tokenizer.ggml.token_type_count"] == 2
    assert f["tokenizer.ggml.tokens"][:3] == ["[PAD]", "[UNK]", "[CLS]"]        # control tokens kept as is
    assert "\u2581cat" in f["tokenizer.ggml.tokens"] and "s" in f["tokenizer.ggml.tokens"]   # "cat", "##s"


def test_unknown_architecture_lists_the_supported_ones(hf_dir, tmp_path):
    d = copy_without(hf_dir, tmp_path)
    config = json.loads((d / "config.json").read_text())
    config["architectures"] = ["FrobnicatorForCausalLM"]
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match="FrobnicatorForCausalLM.*supported: .*BertModel"):
        convert(d, tmp_path / "out.gguf", progress=False)
    assert "BertForSequenceClassification" in supported_architectures()
    assert not (tmp_path / "out.gguf").exists()


def test_missing_tokenizer_is_refused_and_nothing_is_left(hf_dir, tmp_path):
    d = copy_without(hf_dir, tmp_path, "tokenizer.json")
    out = tmp_path / "out.gguf"
    with pytest.raises(ConvertError, match="no tokenizer.json"):
        convert(d, out, progress=False)
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_failed_conversion_keeps_the_previous_file(hf_dir, tmp_path):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"previous")
    d = copy_without(hf_dir, tmp_path, "tokenizer.json")
    with pytest.raises(ConvertError):
        convert(d, out, progress=False)
    assert out.read_bytes() == b"previous" and leftovers(tmp_path) == []


@pytest.mark.parametrize("remove, message", [("config.json", "no config.json"),
                                             ("model.safetensors", "no weights")])
def test_missing_files(hf_dir, tmp_path, remove, message):
    from ggflow.errors import ModelLoadError

    d = copy_without(hf_dir, tmp_path, remove)
    with pytest.raises(ModelLoadError, match=message):
        convert(d, tmp_path / "out.gguf", progress=False)


def test_bad_outtype(hf_dir, tmp_path):
    with pytest.raises(ConvertError, match="outtype 'q4_0' is not one of f32, f16, bf16, q8_0"):
        convert(hf_dir, tmp_path / "out.gguf", "q4_0", progress=False)


def test_cli_converts_and_reports_errors_in_one_line(hf_dir, tmp_path, capsys):
    assert main(["convert", "-q", str(hf_dir), str(tmp_path / "m.gguf"), "--outtype", "bf16"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["convert", "-q", str(tmp_path / "nowhere"), str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a directory" in err and err.count("\n") == 1
