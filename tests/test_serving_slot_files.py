"""/slots/{id}?action=save|restore on ggflow serve (llama-server's slot files, in ggflow's own format): a saved
slot restored into an emptied cache is reused by the next prompt that extends it, and gives the same text;
file names that leave the folder, corrupt and foreign files are refused with 400 before the slot is touched."""
from __future__ import annotations

import json
import os
import struct

import httpx
import pytest

from tests.fixtures.default_model import needs_model

pytestmark = needs_model

TIMEOUT_S = 120
PROMPT = "Once upon a time, in a small village by the sea, there lived"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(folder):
    from ggflow.api import default_model_path
    from ggflow.serving.app import ServerState
    from ggflow.serving.engine import Engine
    from tests.test_serving_http import serving

    engine = Engine.load(default_model_path(), n_ctx=512, n_slots=2, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="smollm2", engine=engine, slot_save_path=str(folder))) as url:
        yield url


@pytest.fixture()
def h(server):
    with httpx.Client(base_url=server, timeout=TIMEOUT_S) as c:
        yield c


def _erase_all(h):
    for s in h.get("/slots").json():
        assert h.post(f"/slots/{s['id']}", params={"action": "erase"}).status_code == 200


def _run(h):
    r = h.post("/completion", json={"prompt": PROMPT, "n_predict": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_save_erase_restore_is_reused_and_gives_the_same_text(h, folder):
    _erase_all(h)
    first = _run(h)
    (slot,) = [s for s in h.get("/slots").json() if s["n_cached"] > 0]
    saved = h.post(f"/slots/{slot['id']}", params={"action": "save"}, json={"filename": "one.bin"})
    assert saved.status_code == 200, saved.text
    n_saved = saved.json()["n_saved"]
    assert [s["n_cached"] for s in h.get("/slots").json() if s["id"] == slot["id"]] == [n_saved]
    assert n_saved > first["tokens_evaluated"] and saved.json()["n_written"] == os.path.getsize(folder / "one.bin")
    assert (folder / "one.bin").read_bytes()[:8] == b"GGFSLOT1"
    _erase_all(h)
    restored = h.post(f"/slots/{slot['id']}", params={"action": "restore"}, json={"filename": "one.bin"})
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_restored"] == n_saved
    assert [s["n_cached"] for s in h.get("/slots").json() if s["id"] == slot["id"]] == [n_saved]
    again = _run(h)
    assert again["content"] == first["content"]
    assert again["timings"]["cache_n"] == first["tokens_evaluated"] - 1   # the whole prompt but its last token


@pytest.mark.parametrize("name", ["../escape.bin", "a/b.bin", ".hidden", "..", "", "x" * 300, "c:evil", 5])
def test_file_names_that_leave_the_folder_are_refused(h, name):
    for action in ("save", "restore"):
        r = h.post("/slots/0", params={"action": action}, json={"filename": name})
        assert r.status_code == 400 and "filename" in r.json()["error"]["message"], r.text


def test_a_link_out_of_the_folder_is_refused(h, folder, tmp_path):
    (tmp_path / "outside.bin").write_bytes(b"x")
    os.symlink(tmp_path / "outside.bin", folder / "link.bin")
    r = h.post("/slots/0", params={"action": "restore"}, json={"filename": "link.bin"})
    assert r.status_code == 400 and "leaves" in r.json()["error"]["message"]


def test_corrupt_truncated_foreign_and_other_files_are_refused(h, folder):
    _erase_all(h)
    _run(h)
    (slot,) = [s for s in h.get("/slots").json() if s["n_cached"] > 0]
    saved = h.post(f"/slots/{slot['id']}", params={"action": "save"}, json={"filename": "good.bin"})
    assert saved.status_code == 200
    good = (folder / "good.bin").read_bytes()
    flipped = bytearray(good)
    flipped[-5] ^= 0xFF
    cases = {"flip.bin": (bytes(flipped), "checksum"), "short.bin": (good[:20], "truncated"),
             "text.bin": (b"hello world, not a slot", "magic"),
             "v9.bin": (good[:8] + (9).to_bytes(4, "little") + good[12:], "version")}
    # a foreign model's file: the same bytes under another model identity
    n = struct.unpack_from("<I", good, 12)[0]
    header = json.loads(good[16:16 + n])
    header["model"]["sha256"] = "0" * 64
    other = json.dumps(header).encode()
    cases["foreign.bin"] = (good[:12] + struct.pack("<I", len(other)) + other + good[16 + n:], "another model")
    for name, (data, words) in cases.items():
        (folder / name).write_bytes(data)
        r = h.post(f"/slots/{slot['id']}", params={"action": "restore"}, json={"filename": name})
        assert r.status_code == 400 and words in r.json()["error"]["message"], (name, r.text)
    # the slot is untouched by the refusals
    assert [s["n_cached"] for s in h.get("/slots").json() if s["id"] == slot["id"]] == [saved.json()["n_saved"]]
    missing = h.post("/slots/0", params={"action": "restore"}, json={"filename": "nothing.bin"})
    assert missing.status_code == 400 and "not found" in missing.json()["error"]["message"]
    assert h.post("/slots/7", params={"action": "save"}, json={"filename": "x.bin"}).status_code == 400
    assert h.post("/slots/0", params={"action": "save"}, content=b"[1]").status_code == 400
    assert h.post("/slots/0", params={"action": "dance"}).status_code == 400


def test_without_a_slot_save_path_save_is_not_supported():
    from ggflow.api import default_model_path
    from ggflow.serving.app import ServerState
    from ggflow.serving.engine import Engine
    from tests.test_serving_http import serving

    engine = Engine.load(default_model_path(), n_ctx=64, n_slots=1, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="smollm2", engine=engine)) as url, httpx.Client(base_url=url) as h:
        r = h.post("/slots/0", params={"action": "save"}, json={"filename": "x.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]


def test_id_slot_pins_a_request_and_a_file_moves_a_cache_between_slots(h):
    _erase_all(h)
    first = h.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "temperature": 0, "id_slot": 1}).json()
    assert first["id_slot"] == 1
    cached = {s["id"]: s["n_cached"] for s in h.get("/slots").json()}
    assert cached[0] == 0 and cached[1] > 0
    assert h.post("/slots/1", params={"action": "save"}, json={"filename": "s1.bin"}).status_code == 200
    assert h.post("/slots/0", params={"action": "restore"}, json={"filename": "s1.bin"}).status_code == 200
    moved = h.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "temperature": 0, "id_slot": 0}).json()
    assert moved["content"] == first["content"] and moved["timings"]["cache_n"] == first["tokens_evaluated"] - 1
    for bad in (2, -2):
        r = h.post("/completion", json={"prompt": PROMPT, "n_predict": 1, "id_slot": bad})
        assert r.status_code == 400 and "id_slot" in r.json()["error"]["message"]
