"""A weight the CPU backend packs into a copy gives its memory-mapped file pages back; one it reads in place
keeps them; and the model computes the same logits either way.

Residency is read from /proc/self/pagemap (GGUFFile.resident_bytes): the pages mapped in this process,
which is what RSS counts. The models are the shared tiny ones (../shared/models).
"""
from __future__ import annotations

import json
import math
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from ggflow.core.batch import Batch
from ggflow.core.context import Context
from ggflow.core.gguf_file import GGUFFile
from ggflow.core.model import Model
from tests.data_dir import DATA

SHARED = DATA / "models"
PAGE = mmap.PAGESIZE


def skip_without_pagemap(file: GGUFFile) -> None:
    if file.resident_bytes() is None:
        pytest.skip("the kernel does not report page residency (/proc/self/pagemap, Linux only)")


def loaded(name: str) -> Model:
    model = Model.load(SHARED / f"{name}.gguf")
    skip_without_pagemap(model.file)
    int(model.file.data().sum())   # fault every page in: the packer would have read them anyway
    return model


def resident(model: Model, names) -> int:
    return sum(model.file.resident_bytes(model.weights[n].offset, model.weights[n].nbytes) for n in names)


def matrices(model: Model) -> list[str]:
    return [n for n, t in model.weights.items() if t.n_dims == 2]


def test_weights_packed_into_a_copy_give_their_file_pages_back():
    model = loaded("tiny-llama-hs-q4_k_m")
    names = matrices(model)
    size = sum(model.weights[n].nbytes for n in names)
    assert resident(model, names) >= 0.9 * size
    ctx = Context(model, n_ctx=64, backends="cpu")
    # at most the two pages a weight shares with its neighbours stay
    assert resident(model, names) <= 2 * PAGE * len(names) < 0.2 * size
    ctx.decode(Batch.from_tokens([1, 2, 3]))   # the kernels read the packed copies, not the file
    assert resident(model, [n for n in names if n != "token_embd.weight"]) <= 2 * PAGE * len(names)


def test_a_weight_gives_its_rows_pages_back_as_they_are_packed(monkeypatch):
    """The pages of a weight's rows go as each run of rows is packed, not when the whole weight is: a weight
    is never resident in the file and in its packed copy at once (beyond a run)."""
    from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
    model = loaded("tiny-llama-hs-q4_k_m")
    name = max(matrices(model), key=lambda n: model.weights[n].nbytes)
    weight = model.weights[name]
    monkeypatch.setattr(qmm, "PACK_CHUNK_BYTES", 1)          # one tile of rows a run
    seen = []
    real_pack = qmm.pack_weight

    def pack_weight(w, w_type, packed_rows=None):
        def after_run(r0, r1):
            packed_rows(r0, r1)
            seen.append((r1, model.file.resident_bytes(weight.offset, weight.nbytes)))
        return real_pack(w, w_type, after_run if w.ctypes.data == weight.numpy().ctypes.data else packed_rows)

    monkeypatch.setattr(qmm, "pack_weight", pack_weight)
    Context(model, n_ctx=64, backends="cpu")
    rows, row_bytes = weight.ne[1], weight.nbytes // weight.ne[1]
    assert len(seen) == -(-rows // qmm.TILE) > 1
    for r1, resident_now in seen:    # the rows not yet packed, the page holding row r1, the weight's first page
        assert resident_now <= (rows - r1) * row_bytes + 3 * PAGE


def test_weights_read_in_place_keep_their_pages():
    model = loaded("tiny-llama-hs-f32")      # F32 matrices: the packs are the mapped bytes themselves
    names = matrices(model)
    before = resident(model, names)
    Context(model, n_ctx=64, backends="cpu")
    assert resident(model, names) == before >= 0.9 * sum(model.weights[n].nbytes for n in names)


def test_the_logits_do_not_change_when_the_pages_are_released(monkeypatch):
    # qwen2's output matrix is the token embedding: packed for the lm_head, and its released rows read
    # again, from re-faulted pages, by get_rows
    name, prompt = "tiny-qwen2-hs-q8_0", [5, 77, 301, 12, 640 - 1, 0, 42]

    def run(model: Model) -> tuple[list[np.ndarray], int]:
        ctx = Context(model, n_ctx=64, backends="cpu")
        embd = model.weights["token_embd.weight"]
        embd_resident = model.file.resident_bytes(embd.offset, embd.nbytes)
        assert ctx.decode(Batch.from_tokens(prompt, all_logits=True)) == 0
        logits = [ctx.get_logits().copy()]
        for i, token in enumerate([9, 3, 250]):
            assert ctx.decode(Batch.from_tokens([token], pos0=len(prompt) + i)) == 0
            logits.append(ctx.get_logits().copy())
        return logits, embd_resident

    model = loaded(name)
    released, embd_resident = run(model)
    assert embd_resident <= 2 * PAGE
    # get_rows read its rows with pread (ops/file_rows.py): the released pages were not mapped again
    embd = model.weights["token_embd.weight"]
    assert model.file.resident_bytes(embd.offset, embd.nbytes) <= 2 * PAGE
    monkeypatch.setattr(GGUFFile, "release", lambda self, offset, nbytes: 0)
    kept, embd_resident = run(loaded(name))
    assert embd_resident > 2 * PAGE
    for a, b in zip(released, kept, strict=True):
        np.testing.assert_array_equal(a, b)


def test_release_drops_the_whole_pages_inside_the_range_and_the_bytes_read_back_the_same():
    file = GGUFFile(SHARED / "tiny-llama-hs-f32.gguf")
    skip_without_pagemap(file)
    info = max(file.tensors, key=lambda t: math.prod(t.ne))
    offset, nbytes = info.offset + 100, 4 * math.prod(info.ne) - 200   # ends inside pages on purpose
    data = file.data()
    before = data[offset - PAGE:offset + nbytes + PAGE].copy()
    first, end = -(-offset // PAGE) * PAGE, (offset + nbytes) // PAGE * PAGE
    assert file.release(PAGE + 1, PAGE) == 0                 # inside two pages, covering neither
    assert file.release(offset, nbytes) == end - first > 0
    assert file.resident_bytes(first, end - first) == 0
    assert file.resident_bytes(first - PAGE, PAGE) == PAGE   # the page it shares with a neighbour stays
    np.testing.assert_array_equal(data[offset - PAGE:offset + nbytes + PAGE], before)
    assert file.resident_bytes(first, end - first) == end - first


def test_the_header_pages_go_once_the_metadata_is_read():
    file = GGUFFile(SHARED / "tiny-llama-hs-q4_k_m.gguf")
    skip_without_pagemap(file)
    whole_pages = file.pos // PAGE * PAGE
    assert whole_pages >= PAGE
    assert file.resident_bytes(0, whole_pages) == 0
    assert file.kv_entry("general.architecture").endswith(b"llama")   # read again from the file


def test_bench_reports_how_little_of_the_file_stays_mapped(capsys):
    from ggflow.cli import main

    path = SHARED / "tiny-llama-hs-q4_k_m.gguf"
    assert main(["bench", "-m", str(path), "-p", "4", "-n", "2", "-r", "1", "-t", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    skip_without_pagemap(GGUFFile(path))
    assert report["model_mapped_mb"] < 0.25 * report["size_mb"]
    assert report["peak_rss_mb"] > report["model_mapped_mb"]


def test_rows_read_from_the_file_match_the_mapped_bytes_and_a_short_file_is_an_error(tmp_path):
    from ggflow.backends_builtin.cpu.ops.file_rows import pread_rows

    file = GGUFFile(SHARED / "tiny-llama-hs-q8_0.gguf")
    info = next(t for t in file.tensors if t.name == "token_embd.weight")
    row_bytes = info.ne[0] // 32 * 34                       # Q8_0: 34 bytes a block of 32
    ids = np.array([[[0, info.ne[1] - 1, 7, 7]]], np.int32)
    out = np.empty((ids.size, row_bytes), np.uint8)
    assert pread_rows(file.fileno, info.offset, row_bytes, ids, out) == -1
    mapped = file.data()[info.offset:info.offset + info.ne[1] * row_bytes].reshape(info.ne[1], row_bytes)
    np.testing.assert_array_equal(out, mapped[ids.reshape(-1)])

    short = tmp_path / "short.bin"
    short.write_bytes(bytes(range(256)) * 4)                # 1024 bytes: rows 0-7 of 128, not row 8
    fd = os.open(short, os.O_RDONLY)
    try:
        rows = np.empty((3, 128), np.uint8)
        assert pread_rows(fd, 0, 128, np.array([1, 8, 2]), rows) == 1
        assert pread_rows(fd, 0, 128, np.array([7, 0, 2]), rows) == -1
        np.testing.assert_array_equal(rows[0], np.frombuffer(short.read_bytes()[896:1024], np.uint8))
    finally:
        os.close(fd)
