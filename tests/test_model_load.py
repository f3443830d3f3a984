"""Loading GGUF models: weights are views of the file, hyperparameters per architecture, bad files named."""
from __future__ import annotations

import mmap
from pathlib import Path

import gguf
import numpy as np
import pytest

from ggflow.core.model import Model
from ggflow.errors import ModelLoadError
from tests.fixtures.tiny_models import SPECS, rewrite_model, write_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    for arch in SPECS:
        write_tiny_model(d / f"{arch}.gguf", arch)
    return d


@pytest.mark.parametrize("arch", list(SPECS))
def test_hparams_and_weights_come_from_the_file(tiny_dir, arch):
    model = Model.load(tiny_dir / f"{arch}.gguf")
    spec, hp = SPECS[arch], model.hparams
    assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_ff) == (
        spec.n_embd, spec.n_layer, spec.n_head, spec.n_head_kv, spec.n_ff)
    assert model.arch.names[0] == arch
    reader = gguf.GGUFReader(tiny_dir / f"{arch}.gguf")
    for rt in reader.tensors:
        t = model.weights[rt.name]
        np.testing.assert_array_equal(t.numpy().reshape(-1), np.asarray(rt.data).reshape(-1))


def test_weights_are_views_of_the_memory_map_not_copies(tiny_dir):
    model = Model.load(tiny_dir / "llama.gguf")
    arr = model.weights["blk.0.attn_q.weight"].numpy()
    assert not arr.flags.owndata and not arr.flags.writeable  # a read-only view, not a copy
    assert np.shares_memory(arr, model.file.data())
    assert isinstance(model.file._mm, mmap.mmap)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        Model.load(tmp_path / "nope.gguf")


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        Model.load(bad)


@pytest.mark.parametrize("keep", [0.3, 0.9, 0.999])
def test_truncated_file_is_named_not_a_crash(tiny_dir, tmp_path, keep):
    src = tiny_dir / "llama.gguf"
    data = src.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        Model.load(cut)


def test_truncated_in_the_header(tiny_dir, tmp_path):
    cut = tmp_path / "header.gguf"
    cut.write_bytes((tiny_dir / "llama.gguf").read_bytes()[:200])
    with pytest.raises(ModelLoadError, match="header.gguf"):
        Model.load(cut)


def test_unknown_architecture_is_named_with_the_registered_ones(tiny_dir, tmp_path):
    path = rewrite_model(tiny_dir / "llama.gguf", tmp_path / "m.gguf", arch="mamba9")
    with pytest.raises(ModelLoadError, match=r"mamba9.*llama"):
        Model.load(path)


@pytest.mark.parametrize("arch, change, message", [
    ("llama", {"drop": "blk.1.ffn_up.weight"}, r"blk\.1\.ffn_up\.weight.*missing"),
    ("qwen3", {"drop": "blk.0.attn_q_norm.weight"}, r"blk\.0\.attn_q_norm\.weight.*missing.*\[128\]"),
    ("llama", {"reshape": "blk.0.attn_k.weight"}, r"blk\.0\.attn_k\.weight.*\[128, 32\].*expected \[128, 64\]"),
    ("qwen2", {"reshape": "blk.1.attn_q.bias"}, r"blk\.1\.attn_q\.bias.*\[1, 64\].*expected \[128\]"),  # optional
], ids=["missing", "missing-qwen3-q-norm", "misshapen", "misshapen-optional-bias"])
def test_a_missing_or_misshapen_tensor_is_named_with_the_shapes(tiny_dir, tmp_path, arch, change, message):
    path = rewrite_model(tiny_dir / f"{arch}.gguf", tmp_path / "m.gguf", **change)
    with pytest.raises(ModelLoadError, match=message):
        Model.load(path)


def test_the_weight_record_holds_the_files_own_tensors(tiny_dir):
    model = Model.load(tiny_dir / "llama.gguf")
    w = model.w
    assert len(w.layers) == model.hparams.n_layer
    assert w.tok_embd is model.weights["token_embd.weight"]
    assert w.layers[1].wq is model.weights["blk.1.attn_q.weight"]
    assert w.layers[0].ffn_down is model.weights["blk.0.ffn_down.weight"]
    assert np.shares_memory(w.layers[1].wk.numpy(), model.file.data())


def test_absent_optional_weights_are_none_and_present_ones_are_filled(tiny_dir):
    llama, qwen2 = Model.load(tiny_dir / "llama.gguf"), Model.load(tiny_dir / "qwen2.gguf")
    assert llama.w.layers[0].bq is None and llama.w.rope_freqs is None
    assert llama.w.output is llama.weights["output.weight"]
    assert qwen2.w.output is None                                  # tied to token_embd
    assert qwen2.w.layers[1].bv is qwen2.weights["blk.1.attn_v.bias"]


def test_a_models_long_metadata_arrays_are_decoded_from_the_file_when_read(tiny_model_path, monkeypatch):
    from ggflow.core import gguf_file
    from ggflow.core.gguf_file import GGUFFile, LazyValue

    monkeypatch.setattr(gguf_file, "LAZY_ARRAY_MIN", 8)     # the tiny model's vocabulary counts as long
    path = tiny_model_path("llama")
    model = Model.load(path)
    eager = GGUFFile(path).fields
    held = model.file.fields._values
    assert isinstance(held["tokenizer.ggml.tokens"], LazyValue)
    assert not isinstance(held["general.architecture"], LazyValue)
    assert list(model.file.fields) == list(eager)
    for key, value in eager.items():
        np.testing.assert_array_equal(np.asarray(model.file.fields[key], dtype=object),
                                      np.asarray(value, dtype=object), err_msg=key)
    monkeypatch.setattr(gguf_file, "LAZY_ARRAY_MIN", 1 << 30)
    assert model.vocab.tokenize("hello world") == Model.load(path).vocab.tokenize("hello world")


def test_a_lazy_array_that_does_not_decode_is_a_load_error(tiny_model_path, tmp_path, monkeypatch):
    from ggflow.core import gguf_file

    monkeypatch.setattr(gguf_file, "LAZY_ARRAY_MIN", 8)
    data = bytearray(Path(tiny_model_path("llama")).read_bytes())
    model = Model.load(tiny_model_path("llama"))
    lazy = model.file.fields._values["tokenizer.ggml.tokens"]
    first_string = lazy.at + 4 + 8 + 8          # element type, count, the first string's length
    data[first_string] = 0xFF                    # not UTF-8
    bad = tmp_path / "bad-vocab.gguf"
    bad.write_bytes(bytes(data))
    # the token list is decoded (and dropped) while loading, to check it against the vocabulary size: a
    # broken one is refused there, as when it was held
    with pytest.raises(ModelLoadError, match="not a readable GGUF file.*UnicodeDecodeError"):
        Model.load(bad)
