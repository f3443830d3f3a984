"""The prompt cache of ``LLM.set_cache``: llama-cpp-python's ``LlamaRAMCache`` / ``LlamaDiskCache`` API.

After a generation the LLM's state (LLM.save_state: its cached tokens and their K/V) is stored keyed by those
tokens; before the next, the entry sharing the longest prefix with the prompt is restored when it shares more
than the LLM's own cache does (llama-cpp-python's rule), so the prompt evaluates only what follows it.
Entries go least recently used first when the cache passes ``capacity_bytes``.

``LlamaDiskCache`` keeps one file per entry, which survives the process: a magic, a JSON header (format
version, the model's identity, the KV cache's layout, the key tokens, the payload's SHA-256) and the payload
(an ``.npz`` of the state's arrays, read without pickle). A file of another model, layout or format version,
or whose payload does not match its checksum, is skipped with a warning and counted in ``stats.rejected``;
it is never loaded. The model's identity is the SHA-256 of the GGUF file's size and first 4 MiB (its
metadata and tensor list: another model or another quantization of one differs there).
"""
from __future__ import annotations

import collections
import hashlib
import io
import json
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ggflow.api.state import LLMState
from ggflow.errors import ArgumentError, GGFlowError
from ggflow.generation.admission import common_prefix_length

log = logging.getLogger(__name__)

MAGIC = b"GGFLOWKV"
FORMAT_VERSION = 1
SUFFIX = ".ggkv"
IDENTITY_BYTES = 4 << 20


@dataclass
class CacheStats:
    hits: int = 0        # lookups that found a prefix
    misses: int = 0
    writes: int = 0
    evictions: int = 0   # entries dropped for capacity
    rejected: int = 0    # disk files refused: another model / layout / format version, bad checksum, unreadable


def model_identity(path: str) -> str:
    """The SHA-256 of a GGUF file's size and first 4 MiB."""
    h = hashlib.sha256(str(os.path.getsize(path)).encode())
    with open(path, "rb") as f:
        h.update(f.read(IDENTITY_BYTES))
    return h.hexdigest()


def kv_layout(context: Any) -> str:
    """What a saved state's K/V must match to load into a context: its size, cells, layers and their types."""
    m = context.memory
    rows = sorted({f"{t.type.name}x{t.ne[0]}" for t in (*m.k, *m.v)})
    return f"n_ctx={context.n_ctx} cells={m.size} layers={len(m.k)} rows={','.join(rows)}"


class BaseLlamaCache:
    """llama-cpp-python's BaseLlamaCache: ``cache[tokens]`` -> the state of the longest cached prefix of them
    (KeyError: none), ``tokens in cache``, ``cache[tokens] = state``, ``cache_size`` in bytes."""

    def __init__(self, capacity_bytes: int = (2 << 30)):
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ArgumentError("capacity_bytes", capacity_bytes, "a number of bytes >= 0")
        self.capacity_bytes = capacity_bytes
        self.stats = CacheStats()
        self.model_id: str | None = None     # set by LLM.set_cache: what a disk entry must have been saved by
        self.layout: str | None = None

    def bind(self, model_id: str, layout: str) -> None:
        self.model_id, self.layout = model_id, layout

    @property
    def cache_size(self) -> int:
        raise NotImplementedError

    def longest_prefix(self, key: Sequence[int]) -> tuple[Any, int]:
        """(the entry's handle, the length it shares with key); (None, 0) when none shares a token."""
        raise NotImplementedError

    def __getitem__(self, key: Sequence[int]) -> LLMState:
        state = self.lookup(key)
        if state is None:
            raise KeyError("no cached prefix of these tokens")
        return state

    def __contains__(self, key: Sequence[int]) -> bool:
        return self.longest_prefix(list(key))[0] is not None

    def lookup(self, key: Sequence[int]) -> LLMState | None:
        raise NotImplementedError


class LlamaRAMCache(BaseLlamaCache):
    """States in memory, least recently used first out."""

    def __init__(self, capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        self.cache_state: collections.OrderedDict[tuple[int, ...], LLMState] = collections.OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(s.llama_state_size for s in self.cache_state.values())

    def longest_prefix(self, key: Sequence[int]) -> tuple[Any, int]:
        best, n = None, 0
        for k in self.cache_state:
            m = common_prefix_length(k, key)
            if m > n:
                best, n = k, m
        return best, n

    def lookup(self, key: Sequence[int]) -> LLMState | None:
        k, _ = self.longest_prefix(list(key))
        if k is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self.cache_state.move_to_end(k)
        return self.cache_state[k]

    def __setitem__(self, key: Sequence[int], value: LLMState) -> None:
        key = tuple(int(t) for t in key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        self.stats.writes += 1
        while self.cache_size > self.capacity_bytes and self.cache_state:
            self.cache_state.popitem(last=False)
            self.stats.evictions += 1


LlamaCache = LlamaRAMCache   # llama-cpp-python's older name


@dataclass
class _Entry:
    path: Path
    mtime_ns: int
    key: tuple[int, ...] | None   # None: rejected
    header: dict


class LlamaDiskCache(BaseLlamaCache):
    """States in files under ``cache_dir`` (one per entry), least recently used (by mtime) first out."""

    def __init__(self, cache_dir: str = ".cache/ggflow_cache", capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ArgumentError("cache_dir", cache_dir, f"a directory ggflow can create and write ({e})") from None
        self._entries: dict[Path, _Entry] = {}

    @property
    def cache_size(self) -> int:
        return sum(size for _, size, _ in self._stats())

    def _files(self) -> list[Path]:
        return [p for p in self.cache_dir.glob(f"*{SUFFIX}") if p.is_file()]

    def _stats(self) -> list[tuple[int, int, Path]]:
        """(mtime, size, path) of every entry file, oldest first (a file another process removed meanwhile
        is left out)."""
        out = []
        for p in self._files():
            try:
                st = p.stat()
            except OSError:
                continue
            out.append((st.st_mtime_ns, st.st_size, p))
        return sorted(out)

    # -- reading ---------------------------------------------------------------------------------
    def _scan(self) -> list[_Entry]:
        """Every file's header, read once per version of the file; rejected files warned about once."""
        seen = {}
        for p in self._files():
            try:
                mtime = p.stat().st_mtime_ns
            except OSError:
                continue
            e = self._entries.get(p)
            if e is None or e.mtime_ns != mtime:
                e = self._read_header(p, mtime)
            seen[p] = e
        self._entries = seen
        return [e for e in seen.values() if e.key is not None]

    def _read_header(self, path: Path, mtime: int) -> _Entry:
        try:
            with open(path, "rb") as f:
                head = f.read(len(MAGIC) + 4)
                if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
                    return self._reject(path, mtime, "not a ggflow cache file")
                (n,) = struct.unpack("<I", head[len(MAGIC):])
                header = json.loads(f.read(n).decode())
                header["_payload_offset"] = len(MAGIC) + 4 + n
        except (OSError, ValueError, UnicodeDecodeError) as e:
            return self._reject(path, mtime, f"unreadable header ({e})")
        version = header.get("version") if isinstance(header, dict) else "?"
        if version != FORMAT_VERSION:
            return self._reject(path, mtime, f"format version {version}, this ggflow reads version {FORMAT_VERSION}")
        if header.get("model") != self.model_id:
            return self._reject(path, mtime, f"saved by another model ({str(header.get('model'))[:12]}..., this "
                                f"one is {str(self.model_id)[:12]}...)")
        if header.get("layout") != self.layout:
            return self._reject(path, mtime, f"a KV cache of another layout ({header.get('layout')}; this LLM's "
                                f"is {self.layout})")
        return _Entry(path, mtime, tuple(int(t) for t in header["key"]), header)

    def _reject(self, path: Path, mtime: int, why: str, header: dict | None = None) -> _Entry:
        log.warning("prompt cache: skipping %s: %s", path, why)
        self.stats.rejected += 1
        return _Entry(path, mtime, None, header or {})

    def longest_prefix(self, key: Sequence[int]) -> tuple[Any, int]:
        best, n = None, 0
        for e in self._scan():
            m = common_prefix_length(e.key, key)
            if m > n:
                best, n = e, m
        return best, n

    def lookup(self, key: Sequence[int]) -> LLMState | None:
        """The state of the longest cached prefix of key whose file checks out (None: none does)."""
        key = list(key)
        candidates = sorted(((common_prefix_length(e.key, key), e) for e in self._scan()),
                            key=lambda c: -c[0])
        for shared, e in candidates:
            if shared == 0:
                break
            state = self._load(e)
            if state is not None:
                self.stats.hits += 1
                return state
        self.stats.misses += 1
        return None

    def _load(self, e: _Entry) -> LLMState | None:
        h = e.header
        try:
            with open(e.path, "rb") as f:
                f.seek(h["_payload_offset"])
                payload = f.read()
        except (OSError, KeyError) as exc:
            self._entries[e.path] = self._reject(e.path, e.mtime_ns, f"unreadable ({exc})")
            return None
        if len(payload) != h.get("payload_bytes") or hashlib.sha256(payload).hexdigest() != h.get("payload_sha256"):
            self._entries[e.path] = self._reject(e.path, e.mtime_ns, "the payload does not match its checksum")
            return None
        try:
            state = _state_from_npz(payload, h)
        except (ValueError, KeyError, OSError) as exc:
            self._entries[e.path] = self._reject(e.path, e.mtime_ns, f"a malformed payload ({exc})")
            return None
        now = time.time()
        os.utime(e.path, (now, now))                      # most recently used
        self._entries.pop(e.path, None)
        return state

    # -- writing ---------------------------------------------------------------------------------
    def __setitem__(self, key: Sequence[int], value: LLMState) -> None:
        if self.model_id is None:
            raise GGFlowError("this disk cache has no model: give it to an LLM with llm.set_cache(cache) first")
        key = [int(t) for t in key]
        payload = _state_to_npz(value)
        header = {"version": FORMAT_VERSION, "model": self.model_id, "layout": self.layout, "key": key,
                  "n_ctx": value.n_ctx, "reusable": value.reusable, "seed": value.seed,
                  "payload_bytes": len(payload), "payload_sha256": hashlib.sha256(payload).hexdigest()}
        raw = json.dumps(header).encode()
        name = hashlib.sha256(np.asarray(key, np.int64).tobytes() + self.model_id.encode()).hexdigest()[:32]
        path = self.cache_dir / f"{name}{SUFFIX}"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(raw)) + raw + payload)
        os.replace(tmp, path)                             # readers never see half a file
        self.stats.writes += 1
        self._trim()

    def _trim(self) -> None:
        files = self._stats()
        total = sum(size for _, size, _ in files)
        for _, size, p in files:
            if total <= self.capacity_bytes:
                break
            p.unlink(missing_ok=True)
            self._entries.pop(p, None)
            total -= size
            self.stats.evictions += 1


def _state_to_npz(state: LLMState) -> bytes:
    m = state.memory
    arrays = {"input_ids": np.asarray(state.input_ids, np.int32), "cells": m.cells, "pos": m.pos,
              "shift": m.shift, **{f"k{i}": a for i, a in enumerate(m.k)}, **{f"v{i}": a for i, a in enumerate(m.v)}}
    buf = io.BytesIO()
    np.savez(buf, size=np.asarray(m.size), n_layers=np.asarray(len(m.k)), **arrays)
    return buf.getvalue()


def _state_from_npz(payload: bytes, header: dict) -> LLMState:
    from ggflow.core.kv_cache import KVSeqState

    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        n = int(z["n_layers"])
        memory = KVSeqState(int(z["size"]), z["cells"], z["pos"], z["shift"], [z[f"k{i}"] for i in range(n)],
                            [z[f"v{i}"] for i in range(n)])
        ids = z["input_ids"].astype(np.intc)
    return LLMState(ids, int(header["n_ctx"]), memory, int(header["reusable"]), header.get("seed"))


class CacheMixin:
    """``LLM.set_cache`` and the two moments the cache is used (the caller holds the LLM's turn)."""
    cache: BaseLlamaCache | None = None

    def set_cache(self, cache: BaseLlamaCache | None) -> None:
        """Keep each generation's state in ``cache`` (a LlamaRAMCache or LlamaDiskCache; None: no cache) and
        start the next from the longest prefix it holds."""
        if cache is not None and not isinstance(cache, BaseLlamaCache):
            raise ArgumentError("cache", cache, "a ggflow.LlamaRAMCache, ggflow.LlamaDiskCache or None")
        ctx = self._require_context()
        if isinstance(cache, LlamaDiskCache):
            from ggflow.core.kv_cache import KVCache
            if type(ctx.memory) is not KVCache:
                raise ArgumentError("cache", cache, f"a LlamaRAMCache: the disk cache stores the unified KV cache "
                                    f"and this model's memory is a {type(ctx.memory).__name__}")
            cache.bind(model_identity(self.model_path), kv_layout(ctx))
        self.cache = cache

    def _restore_prefix(self, prompt: Sequence[int]) -> None:
        """Before a prompt: load the cached state sharing more of it than the LLM's own cache does."""
        cache = self.cache
        if cache is None:
            return
        own = common_prefix_length(self._cached[: self._reusable], prompt)
        handle, shared = cache.longest_prefix(list(prompt))
        if handle is None or min(shared, len(prompt) - 1) <= own:
            return
        state = cache.lookup(prompt)
        if state is not None:
            self._restore_state(state)

    def _store_state(self) -> None:
        """After a generation: keep the state under the tokens it caches."""
        if self.cache is None or not self._reusable:
            return
        state = self._copy_state()
        self.cache[list(state.input_ids[: state.reusable])] = state
