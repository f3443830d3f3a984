"""ggflow imatrix: llama-imatrix's statistics, its GGUF and legacy .dat formats.

- The sums against an independent reference: transformers (PyTorch CPU) running the same tiny GGUF model on
  the same chunks, each nn.Linear's inputs captured by a forward hook and their squares summed by numpy.
  With the KV cache in F32 (llama.cpp's default F16 alone moves attn_output's sums by 7e-4) the two runs'
  activations differ only by float rounding (different kernels and summation orders): the sums agree to a
  relative 1e-4 (measured: 2.4e-6); a wrong column, chunk, BOS or count is off by far more. Counts
  are exact.
- The file against gguf-py's GGUFReader (llama.cpp's own Python reader of the format): keys, their types,
  no general.architecture, tensor names, order, shapes and F32 data, as imatrix.cpp's save_imatrix writes.
- Experts (mul_mat_id) on a tiny qwen3moe: each token's row goes to each of its n_used experts, so the
  counts add up to n_used x tokens and the experts' sums add up to n_used x the router's (which reads the
  same rows as a dense product): an identity between two independently collected entries.
"""
from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from ggflow.cli import main
from ggflow.core.model import Model
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor
from ggflow.errors import GGFlowError, ImatrixError
from ggflow.imatrix import Collector, Entry, Imatrix, compute_imatrix, read_imatrix, write_dat, write_gguf
from ggflow.imatrix.collector import MIN_ROWS
from tests.fixtures.tiny_models import write_tiny_model

TEXT = " ".join(f"the {w} fox jumps over {n} lazy dogs near the river bank" for n in range(40)
                for w in ("quick", "brown"))
N_CTX = 32
HF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("imatrix") / "llama.gguf", "llama", "F32", seed=5)


@pytest.fixture(scope="module")
def computed(llama) -> Imatrix:
    return compute_imatrix(llama, TEXT, n_ctx=N_CTX, n_chunks=3, dataset="text.txt", backends="cpu",
                           process_output=True, type_k="F32", type_v="F32")


def chunks(path: Path, n: int) -> list[list[int]]:
    """llama-imatrix's chunks: the text's tokens (with BOS), n_ctx at a time, each starting with BOS."""
    vocab = Model.load(path).vocab
    tokens = vocab.tokenize(TEXT, add_special=True)
    out = [tokens[i * N_CTX:(i + 1) * N_CTX] for i in range(n)]
    for c in out:
        c[0] = vocab.bos_id
    return out


def hf_sums(path: Path, token_chunks: list[list[int]]) -> dict[str, np.ndarray]:
    torch = pytest.importorskip("torch", reason="torch (the reference) is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers (the reference) is not installed")
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    sums: dict[str, np.ndarray] = {}

    def hook(name):
        def f(module, args):
            x = args[0].detach().double().numpy().reshape(-1, args[0].shape[-1])
            sums[name] = sums.get(name, 0) + (x * x).sum(axis=0)
        return f
    for hf_name, module in model.named_modules():
        for suffix, gguf_name in HF_NAMES.items():
            if hf_name.endswith(suffix):
                layer = hf_name.split(".")[2]
                module.register_forward_pre_hook(hook(f"blk.{layer}.{gguf_name}.weight"))
        if hf_name == "lm_head":
            module.register_forward_pre_hook(hook("output.weight"))
    with torch.no_grad():
        for c in token_chunks:
            model(torch.tensor([c]))
    return sums


def test_sums_are_the_squared_inputs_of_every_matrix_as_transformers_computes_them(llama, computed):
    ref = hf_sums(llama, chunks(llama, 3))
    assert set(computed.entries) == set(ref)   # every blk.* matrix, and output.weight with process_output
    for name, e in computed.entries.items():
        assert e.sums.shape == (1, ref[name].size) and e.sums.dtype == np.float32
        assert e.counts.tolist() == [3 * N_CTX]
        np.testing.assert_allclose(e.sums[0], ref[name], rtol=1e-4, err_msg=name)
    assert (computed.chunk_count, computed.chunk_size, computed.datasets) == (3, N_CTX, ["text.txt"])


def test_output_weight_only_with_process_output(llama):
    m = compute_imatrix(llama, TEXT, n_ctx=N_CTX, n_chunks=2, backends="cpu")
    assert "output.weight" not in m.entries and all(n.startswith("blk.") for n in m.entries)
    assert m.chunk_count == 2


def test_products_of_fewer_than_16_rows_are_skipped_as_in_llama_cpp():
    c = Collector(frozenset({"blk.0.attn_q.weight"}))
    w = Tensor("F32", (64, 32), name="blk.0.attn_q.weight")
    for rows, wanted in ((MIN_ROWS - 1, False), (MIN_ROWS, True)):
        node = Tensor("F32", (32, rows), op=Op.MUL_MAT, src=(w, Tensor("F32", (64, rows))))
        assert c.wants(node) is wanted
    other = Tensor("F32", (64, 32), name="token_embd.weight")
    assert not c.wants(Tensor("F32", (32, 16), op=Op.MUL_MAT, src=(other, Tensor("F32", (64, 16)))))


def test_a_3d_weight_sums_each_matrix_apart():
    """src0 [k, m, 2, 1] times src1 [k, n, 4, 1]: activation slice i2 belongs to matrix i2 % 2 (broadcast),
    and the dense product keeps one count for both matrices."""
    rng = np.random.default_rng(0)
    w = Tensor("F32", (8, 3, 2, 1), name="blk.0.x.weight")
    x = rng.standard_normal((1, 4, 20, 8)).astype(np.float32)
    node = Tensor("F32", (3, 20, 4, 1), op=Op.MUL_MAT, src=(w, Tensor("F32", (8, 20, 4, 1))))
    c = Collector(frozenset({w.name}))
    c.observe(node, [x])
    e = c.entries[w.name]
    want = np.concatenate([(x[0, [0, 2]] ** 2).sum(axis=(0, 1)), (x[0, [1, 3]] ** 2).sum(axis=(0, 1))])
    np.testing.assert_allclose(e.sums, want[None], rtol=1e-6)   # one count: sums (1, 2 * k), as llama.cpp
    assert e.counts.tolist() == [40]


def test_experts_count_each_routed_row(tmp_path):
    from tests.fixtures.tiny_moe import N_EXPERT, N_EXPERT_USED as n_used, N_LAYER, write_tiny_moe
    path = tmp_path / "moe.gguf"
    write_tiny_moe(path, "qwen3moe")
    model = Model.load(path)
    m = compute_imatrix(model, TEXT, n_ctx=N_CTX, n_chunks=2, backends="cpu")
    n_tok = 2 * N_CTX
    for layer in range(N_LAYER):
        router = m.entries[f"blk.{layer}.ffn_gate_inp.weight"]
        assert router.counts.tolist() == [n_tok]
        for kind in ("gate", "up"):
            e = m.entries[f"blk.{layer}.ffn_{kind}_exps.weight"]
            assert e.n_mat == N_EXPERT and e.counts.sum() == n_used * n_tok
            np.testing.assert_allclose(e.sums.sum(axis=0), n_used * router.sums[0], rtol=1e-4)
        down = m.entries[f"blk.{layer}.ffn_down_exps.weight"]
        assert down.counts.tolist() == m.entries[f"blk.{layer}.ffn_up_exps.weight"].counts.tolist()


def test_collector_refuses_expert_ids_out_of_range():
    w = Tensor("F32", (8, 4, 3), name="blk.0.ffn_up_exps.weight")
    x, ids = Tensor("F32", (8, 2, 16)), Tensor("I32", (2, 16))
    node = Tensor("F32", (4, 2, 16), op=Op.MUL_MAT_ID, src=(w, x, ids))
    c = Collector(frozenset({w.name}))
    with pytest.raises(GGFlowError, match="expert id"):
        c.observe(node, [np.ones((1, 16, 2, 8), np.float32), np.full((1, 1, 16, 2), 3, np.int32)])


# -- files ------------------------------------------------------------------------------------------
def test_gguf_file_is_llama_imatrix_s_format(computed, tmp_path):
    path = tmp_path / "imatrix.gguf"
    write_gguf(path, computed)
    r = gguf.GGUFReader(path)
    keys = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert set(keys) == {"general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"}
    assert keys["general.type"].contents() == "imatrix"
    assert keys["imatrix.datasets"].contents() == ["text.txt"]
    for k in ("imatrix.chunk_count", "imatrix.chunk_size"):
        assert keys[k].types == [gguf.GGUFValueType.UINT32]
    assert (keys["imatrix.chunk_count"].contents(), keys["imatrix.chunk_size"].contents()) == (3, N_CTX)
    names = [t.name for t in r.tensors]
    assert names == [f"{n}.{s}" for n in sorted(computed.entries) for s in ("in_sum2", "counts")]
    for t in r.tensors:
        e = computed.entries[t.name.rsplit(".", 1)[0]]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        if t.name.endswith(".in_sum2"):
            assert list(t.shape) == [e.sums.shape[1], e.n_mat]
            np.testing.assert_array_equal(np.asarray(t.data).reshape(e.sums.shape), e.sums)
        else:
            assert list(t.shape) == [1, e.n_mat]
            assert np.asarray(t.data).reshape(-1).tolist() == e.counts.astype(float).tolist()
    back = read_imatrix(path)
    assert back.chunk_count == 3 and back.chunk_size == N_CTX and not back.is_legacy and back.has_metadata
    for name, e in computed.entries.items():
        np.testing.assert_array_equal(back.entries[name].sums, e.sums)
        np.testing.assert_array_equal(back.importance(name), e.sums[0] / np.float32(e.counts[0]))   # float / float


def test_legacy_dat_is_written_and_read_as_llama_cpp_does(computed, tmp_path):
    path = tmp_path / "imatrix.dat"
    write_dat(path, computed)
    data = path.read_bytes()
    assert struct.unpack_from("<i", data)[0] == len(computed.entries)
    assert data.endswith(struct.pack("<ii", 3, len("text.txt")) + b"text.txt")
    back = read_imatrix(path)
    assert back.is_legacy and back.chunk_count == 3 and back.datasets == ["text.txt"]
    for name, e in computed.entries.items():
        assert back.entries[name].counts.tolist() == [3]   # ncall: ceil(rows / chunk size)
        # stored sum/count*ncall; llama-quantize divides by ncall: the mean square, to float rounding
        np.testing.assert_allclose(back.importance(name), e.sums[0] / e.counts[0], rtol=1e-6)


@pytest.mark.parametrize("content, match", [
    (b"", "ends at byte 0"), (struct.pack("<i", 0), "no data"), (struct.pack("<ii", 1, 500), "name length"),
    (struct.pack("<ii", 1, 3) + b"abc" + struct.pack("<ii", 1, 1000), "values"),
    (b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8, "GGUF")])
def test_damaged_files_are_refused_with_the_reason(tmp_path, content, match):
    path = tmp_path / "bad.imatrix"
    path.write_bytes(content)
    with pytest.raises(ImatrixError, match=match):
        read_imatrix(path)


def test_gguf_with_sums_but_no_counts_is_refused(tmp_path):
    path = tmp_path / "half.gguf"
    write_gguf(path, Imatrix({"blk.0.a.weight": Entry(np.ones((1, 4), np.float32), np.array([2]))}, ["t"], 1, 2))
    r = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "half2.gguf"), "")
    w.kv_data[0].pop("general.architecture", None)
    w.add_tensor(r.tensors[0].name, np.asarray(r.tensors[0].data))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ImatrixError, match="mismatched sums and counts for blk.0.a.weight"):
        read_imatrix(tmp_path / "half2.gguf")


# -- the command ----------------------------------------------------------------------------------
def test_cli_writes_the_file(llama, computed, tmp_path, capsys):
    text, out = tmp_path / "text.txt", tmp_path / "out.gguf"
    text.write_text(TEXT)
    assert main(["imatrix", "-m", str(llama), "-f", str(text), "-o", str(out), "-c", str(N_CTX), "--chunks", "3",
                 "--process-output", "--backend", "cpu", "--cache-type-k", "f32", "--cache-type-v", "f32",
                 "-q"]) == 0
    back = read_imatrix(out)
    assert back.datasets == [str(text)] and set(back.entries) == set(computed.entries)
    for name, e in computed.entries.items():
        np.testing.assert_array_equal(back.entries[name].sums, e.sums)   # the same computation, bit for bit
    assert "over 3 chunks" in capsys.readouterr().out


def test_cli_skips_chunks_and_refuses_a_short_text(llama, tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("the quick brown fox")
    assert main(["imatrix", "-m", str(llama), "-f", str(text), "-o", str(tmp_path / "o.gguf"), "-c", "32"]) == 2
    assert "you need at least 64 tokens" in capsys.readouterr().err
    text.write_text(TEXT)
    m = compute_imatrix(llama, TEXT, n_ctx=N_CTX, from_chunk=1, n_chunks=1, backends="cpu", type_k="F32", type_v="F32")
    skipped = hf_sums(llama, [chunks(llama, 2)[1]])
    np.testing.assert_allclose(m.entries["blk.0.attn_q.weight"].sums[0], skipped["blk.0.attn_q.weight"], rtol=1e-4)
