"""LLM.set_cache with LlamaRAMCache / LlamaDiskCache (api/llama_cache.py): the longest cached prefix is restored
before a prompt, the text is what an LLM without a cache writes, entries go least recently used first, disk
entries survive the process, and a foreign, old or corrupt file is skipped with a warning, never loaded."""
from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ggflow
from ggflow.api.llama_cache import MAGIC, SUFFIX
from ggflow.errors import ArgumentError
from tests.fixtures.default_model import needs_model

pytestmark = needs_model
N_CTX = 256
STORY = "The lighthouse keeper counted the ships that passed each night and wrote their names in a book."
OTHER = "A recipe for bread: flour, water, salt and yeast, kneaded and left to rise overnight."
MORE = " The next morning"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def llm():
    return ggflow.LLM(n_ctx=N_CTX, n_threads=1)


@pytest.fixture(scope="module")
def reference(llm):
    """Greedy continuations without any cache, from an empty KV cache."""
    llm.set_cache(None)
    out = {}
    for p in (STORY + MORE, OTHER + MORE):
        llm.reset()
        out[p] = llm.generate(p, max_tokens=8, temperature=0)
    return out


def test_ram_cache_restores_the_longest_prefix(llm, reference):
    cache = ggflow.LlamaRAMCache(capacity_bytes=1 << 30)
    llm.reset()
    llm.set_cache(cache)
    llm.generate(STORY, max_tokens=4, temperature=0)
    llm.generate(OTHER, max_tokens=4, temperature=0)       # the LLM's own cache moves on to another prompt
    again = llm.generate(STORY + MORE, max_tokens=8, temperature=0)
    n_story = len(llm.tokenize(STORY.encode()))
    assert again.timings.cached_n >= n_story - 1            # STORY came back from the cache
    assert again.tokens == reference[STORY + MORE].tokens and again.text == reference[STORY + MORE].text
    assert cache.stats.hits >= 1 and len(cache.cache_state) == 3
    assert llm.tokenize(STORY.encode()) in cache          # llama-cpp-python's `in`
    llm.set_cache(None)


def test_ram_cache_evicts_least_recently_used(llm):
    probe = ggflow.LlamaRAMCache()
    llm.reset()
    llm.set_cache(probe)
    llm.generate(STORY, max_tokens=4, temperature=0)
    one = probe.cache_size
    small = ggflow.LlamaRAMCache(capacity_bytes=int(one * 1.5))   # room for about one entry
    llm.set_cache(small)
    llm.generate(STORY, max_tokens=4, temperature=0)
    llm.generate(OTHER, max_tokens=4, temperature=0)
    assert small.stats.evictions >= 1 and small.cache_size <= small.capacity_bytes
    story, other = llm.tokenize(STORY.encode()), llm.tokenize(OTHER.encode())
    assert [list(k[: len(other)]) for k in small.cache_state] == [other]   # STORY's entry went first
    llm.set_cache(None)


def test_cache_arguments_are_checked(llm, tmp_path):
    with pytest.raises(ArgumentError):
        ggflow.LlamaRAMCache(capacity_bytes=-1)
    with pytest.raises(ArgumentError):
        llm.set_cache({"not": "a cache"})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArgumentError):
        ggflow.LlamaDiskCache(cache_dir=str(tmp_path / "file" / "sub"))


def _write_in_another_process(cache_dir: Path) -> None:
    code = textwrap.dedent(f"""
        import ggflow
        llm = ggflow.LLM(n_ctx={N_CTX}, n_threads=1)
        llm.set_cache(ggflow.LlamaDiskCache(cache_dir={str(cache_dir)!r}))
        llm.generate({STORY!r}, max_tokens=4, temperature=0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=600,
                   env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ggkv")
    _write_in_another_process(d)
    return d


def test_disk_cache_survives_the_process(llm, reference, disk_dir):
    assert len(list(disk_dir.glob(f"*{SUFFIX}"))) == 1
    cache = ggflow.LlamaDiskCache(cache_dir=str(disk_dir))
    llm.reset()
    llm.set_cache(cache)
    out = llm.generate(STORY + MORE, max_tokens=8, temperature=0)
    assert out.timings.cached_n >= len(llm.tokenize(STORY.encode())) - 1
    assert out.tokens == reference[STORY + MORE].tokens
    assert cache.stats.hits == 1 and cache.stats.rejected == 0
    llm.set_cache(None)


def _rewrite(path: Path, change) -> None:
    """Rewrite a cache file: change(header) edits its header in place; a payload changer returns new bytes."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<I", raw[len(MAGIC): len(MAGIC) + 4])
    header = json.loads(raw[len(MAGIC) + 4: len(MAGIC) + 4 + n])
    payload = raw[len(MAGIC) + 4 + n:]
    if change is _flip_a_byte:
        payload = change(payload)
    else:
        change(header)
    h = json.dumps(header).encode()
    path.write_bytes(MAGIC + struct.pack("<I", len(h)) + h + payload)


def _flip_a_byte(payload: bytes) -> bytes:
    b = bytearray(payload)
    b[len(b) // 2] ^= 0xFF
    return bytes(b)


@pytest.mark.parametrize("damage, why", [
    (lambda h: h.update(model="0" * 64), "another model"),
    (lambda h: h.update(version=0), "format version"),
    (lambda h: h.update(layout="n_ctx=4096 cells=4096 layers=30 rows=F32x192"), "another layout"),
    (_flip_a_byte, "checksum"),
    (b"junk", "not a ggflow cache file"),
])
def test_a_foreign_old_or_corrupt_file_is_skipped_with_a_warning(llm, reference, disk_dir, tmp_path, caplog,
                                                                 damage, why):
    src = next(disk_dir.glob(f"*{SUFFIX}"))
    bad = tmp_path / src.name
    if isinstance(damage, bytes):
        bad.write_bytes(damage)
    else:
        bad.write_bytes(src.read_bytes())
        _rewrite(bad, damage)
    cache = ggflow.LlamaDiskCache(cache_dir=str(tmp_path))
    llm.reset()
    llm.set_cache(cache)
    with caplog.at_level(logging.WARNING, logger="ggflow.api.llama_cache"):
        out = llm.generate(STORY + MORE, max_tokens=8, temperature=0)
    assert out.timings.cached_n == 0                       # nothing was loaded
    assert out.tokens == reference[STORY + MORE].tokens
    assert cache.stats.rejected == 1 and cache.stats.hits == 0
    assert any(why in r.getMessage() and str(bad) in r.getMessage() for r in caplog.records), caplog.text
    llm.set_cache(None)


def test_disk_cache_trims_to_its_capacity(llm, tmp_path):
    cache = ggflow.LlamaDiskCache(cache_dir=str(tmp_path))
    llm.reset()
    llm.set_cache(cache)
    llm.generate(STORY, max_tokens=4, temperature=0)
    one = cache.cache_size
    cache.capacity_bytes = int(one * 1.5)
    llm.generate(OTHER, max_tokens=4, temperature=0)
    assert cache.stats.evictions == 1 and len(list(tmp_path.glob(f"*{SUFFIX}"))) == 1
    story, other = llm.tokenize(STORY.encode()), llm.tokenize(OTHER.encode())
    assert cache.longest_prefix(other)[1] == len(other) and cache.longest_prefix(story)[1] < len(story) // 2
    llm.set_cache(None)
