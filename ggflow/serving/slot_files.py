"""llama-server's /slots/{id}?action=save|restore: a slot's cached tokens and their K/V cells in a file under
--slot-save-path, and back into a slot, so a later prompt that extends those tokens reuses them.

The file: magic ``GGFSLOT1`` (8 bytes), a little-endian u32 format version, a u32 header length, the header
(UTF-8 JSON: the model's identity, the KV layout, the token count, the payload's SHA-256), then the payload
(numpy .npy arrays one after the other: the tokens, then per KV cache its cells, positions, shifts, K and V
rows, as Memory.save_seq copies them; the layout ggflow/api/state.py's LLMState holds in memory). A file
name with a path in it, one that resolves outside the folder, a file for another model or KV layout, and a
file whose bytes do not match its checksum are refused (400) before the slot is touched. Restored cells go
into free cells of the cache, in order, with their positions.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import struct
import time
from typing import Any

import numpy as np

from ggflow.errors import GGFlowError

MAGIC = b"GGFSLOT1"
VERSION = 1
MAX_HEADER_BYTES = 1 << 20
MAX_FILENAME = 255


class SlotFileError(GGFlowError):
    """A slot file that cannot be written or read back into this server (400)."""


class SlotsDisabled(GGFlowError):
    """Save/restore asked of a server started without --slot-save-path (501, as llama-server)."""


def checked_path(folder: str | None, filename: Any) -> str:
    """The file's path in ``folder``: a plain file name, that stays in the folder once links are resolved."""
    if not folder:
        raise SlotsDisabled("slot save and restore are off: start the server with --slot-save-path DIR")
    if not isinstance(filename, str) or not filename:
        raise SlotFileError("filename must be a non-empty string")
    bad = next((c for c in ("/", "\\", "\0", ":") if c in filename), None)
    if bad is not None or filename in (".", "..") or filename.startswith(".") or len(filename) > MAX_FILENAME:
        raise SlotFileError(f"invalid filename {filename[:80]!r}: a plain file name (no path, no leading dot, "
                            f"at most {MAX_FILENAME} characters) inside --slot-save-path")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, filename))
    if os.path.dirname(path) != root:
        raise SlotFileError(f"invalid filename {filename[:80]!r}: it leaves --slot-save-path")
    return path


def model_identity(model: Any) -> dict[str, Any]:
    """What a slot file must match: the architecture, the vocabulary and the tensors' names, shapes and types."""
    meta = model.metadata
    digest = hashlib.sha256()
    for name in sorted(getattr(model, "tensors", {}) or {}):
        t = model.tensors[name]
        digest.update(f"{name}:{getattr(t, 'shape', '')}:{getattr(t, 'dtype', getattr(t, 'type', ''))};".encode())
    vocab = model.vocab
    digest.update(("\n".join(vocab.token_text(i) for i in range(vocab.n_vocab))).encode("utf-8", "surrogatepass"))
    return {"architecture": str(meta.get("general.architecture")), "n_vocab": vocab.n_vocab,
            "sha256": digest.hexdigest()}


# -- a sequence's KV state <-> named arrays ---------------------------------------------------------------
def _state_arrays(state: Any, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from ggflow.core.kv_cache import KVSeqState
    from ggflow.core.kv_cache_iswa import IswaSeqState
    if isinstance(state, IswaSeqState):
        m1, a1 = _state_arrays(state.base, prefix + "base.")
        m2, a2 = _state_arrays(state.swa, prefix + "swa.")
        return {"kind": "iswa", "base": m1, "swa": m2}, {**a1, **a2}
    if isinstance(state, KVSeqState):
        arrays = {prefix + "cells": state.cells, prefix + "pos": state.pos, prefix + "shift": state.shift}
        arrays.update({f"{prefix}k{i}": a for i, a in enumerate(state.k)})
        arrays.update({f"{prefix}v{i}": a for i, a in enumerate(state.v)})
        layout = [[list(a.shape[1:]), str(a.dtype)] for a in state.k + state.v]
        return {"kind": "kv", "size": int(state.size), "n_layers": len(state.k), "layout": layout}, arrays
    raise SlotFileError(f"this model's memory ({type(state).__name__}) cannot be saved to a slot file")


def _state_from(meta: dict[str, Any], arrays: dict[str, np.ndarray], prefix: str = "") -> Any:
    from ggflow.core.kv_cache import KVSeqState
    from ggflow.core.kv_cache_iswa import IswaSeqState
    if meta["kind"] == "iswa":
        return IswaSeqState(_state_from(meta["base"], arrays, prefix + "base."),
                            _state_from(meta["swa"], arrays, prefix + "swa."))
    n = meta["n_layers"]
    return KVSeqState(meta["size"], arrays[prefix + "cells"], arrays[prefix + "pos"], arrays[prefix + "shift"],
                      [arrays[f"{prefix}k{i}"] for i in range(n)], [arrays[f"{prefix}v{i}"] for i in range(n)])


def _layout(meta: dict[str, Any]) -> Any:
    """The KV layout without the sequence's cell count: what must match between the file and the cache."""
    if meta["kind"] == "iswa":
        return {"kind": "iswa", "base": _layout(meta["base"]), "swa": _layout(meta["swa"])}
    return {k: meta[k] for k in ("kind", "size", "n_layers", "layout")}


# -- the file -------------------------------------------------------------------------------------------
def encode(identity: dict[str, Any], tokens: list[int], state: Any) -> bytes:
    kv_meta, arrays = _state_arrays(state)
    arrays = {"tokens": np.asarray(tokens, dtype=np.int32), **arrays}
    payload = io.BytesIO()
    for name, a in arrays.items():
        np.save(payload, np.ascontiguousarray(a), allow_pickle=False)
    body = payload.getvalue()
    header = json.dumps({"model": identity, "n_tokens": len(tokens), "kv": kv_meta, "arrays": list(arrays),
                         "payload_sha256": hashlib.sha256(body).hexdigest()}).encode()
    return MAGIC + struct.pack("<II", VERSION, len(header)) + header + body


def decode(data: bytes, identity: dict[str, Any], kv_layout: Any, filename: str) -> tuple[list[int], Any]:
    """The tokens and KV state of a slot file written for this model and KV layout; SlotFileError if not."""
    def bad(why: str) -> SlotFileError:
        return SlotFileError(f"slot file {filename!r} {why}")

    if len(data) < len(MAGIC) + 8 or data[:len(MAGIC)] != MAGIC:
        raise bad("is not a ggflow slot file (no GGFSLOT1 magic)")
    version, n_header = struct.unpack_from("<II", data, len(MAGIC))
    if version != VERSION:
        raise bad(f"has format version {version}; this server reads version {VERSION}")
    start = len(MAGIC) + 8
    if n_header > MAX_HEADER_BYTES or start + n_header > len(data):
        raise bad("has a truncated or oversized header")
    try:
        header = json.loads(data[start:start + n_header])
        body = data[start + n_header:]
        if hashlib.sha256(body).hexdigest() != header["payload_sha256"]:
            raise bad("is corrupt: its payload does not match its checksum")
        if header["model"] != identity:
            raise bad(f"was saved for another model ({header['model'].get('architecture')}, "
                      f"n_vocab {header['model'].get('n_vocab')}); this server runs {identity['architecture']}, "
                      f"n_vocab {identity['n_vocab']}")
        if _layout(header["kv"]) != kv_layout:
            raise bad("was saved with another KV cache layout (context size, cache types or layers differ)")
        stream = io.BytesIO(body)
        arrays = {name: np.load(stream, allow_pickle=False) for name in header["arrays"]}
        tokens = [int(t) for t in arrays.pop("tokens")]
        if len(tokens) != header["n_tokens"]:
            raise bad("has a token count that does not match its tokens")
        state = _state_from(header["kv"], arrays)
    except SlotFileError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, EOFError, OSError) as exc:
        raise bad(f"is malformed: {type(exc).__name__}: {str(exc)[:200]}") from None
    if any(not 0 <= t < identity["n_vocab"] for t in tokens):
        raise bad("holds token ids outside the vocabulary")
    return tokens, state


def _into_free_cells(memory: Any, state: Any) -> Any:
    """``state`` moved to the first free cells of ``memory`` (in order, positions kept)."""
    from ggflow.core.kv_cache_iswa import IswaSeqState
    if isinstance(state, IswaSeqState):
        return IswaSeqState(_into_free_cells(memory.base, state.base), _into_free_cells(memory.swa, state.swa))
    free = np.flatnonzero(memory.pos < 0)
    n = len(state.cells)
    if len(free) < n:
        raise SlotFileError(f"the KV cache has {len(free)} free cells; the saved slot needs {n}")
    order = np.argsort(state.cells, kind="stable")
    cells = np.empty_like(state.cells)
    cells[order] = free[:n]
    return dataclasses.replace(state, cells=cells)


class SlotFiles:
    """Save and restore of one engine's slots, under ``folder``."""

    def __init__(self, engine: Any, folder: str | None):
        self.engine, self.folder = engine, folder
        self._identity: dict[str, Any] | None = None
        self._layout: Any = None

    @property
    def identity(self) -> dict[str, Any]:
        if self._identity is None:
            self._identity = model_identity(self.engine.ctx.model)
        return self._identity

    def _slot(self, slot_id: int) -> Any:
        slots = self.engine.slots
        if not 0 <= slot_id < len(slots):
            raise GGFlowError(f"there is no slot {slot_id}: the slots are 0..{len(slots) - 1}")
        slot = slots[slot_id]
        if slot.is_busy:
            raise GGFlowError(f"slot {slot_id} is processing a request; save or restore it when it is idle")
        return slot

    def snapshot(self, slot_id: int, filename: Any) -> tuple[list[int], Any, float]:
        """Runs in the engine thread (the cache is touched only there): a copy of the slot's tokens and cells."""
        checked_path(self.folder, filename)
        t0 = time.perf_counter()
        slot = self._slot(slot_id)
        return list(slot.cache_tokens), self.engine.ctx.memory.save_seq(slot.seq_id), t0

    def write(self, slot_id: int, filename: str, snapshot: tuple[list[int], Any, float]) -> dict[str, Any]:
        """Any thread: the snapshot into its file (written whole, then renamed into place)."""
        tokens, seq_state, t0 = snapshot
        path = checked_path(self.folder, filename)
        data = encode(self.identity, tokens, seq_state)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return {"id_slot": slot_id, "filename": filename, "n_saved": len(tokens), "n_written": len(data),
                "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}

    def read(self, filename: Any) -> tuple[bytes, str]:
        """The file's bytes (any thread): refused if it is not a file in the folder."""
        path = checked_path(self.folder, filename)
        if not os.path.isfile(path):
            raise SlotFileError(f"slot file {filename!r} not found in --slot-save-path")
        with open(path, "rb") as f:
            return f.read(), path

    def kv_layout(self) -> Any:
        if self._layout is None:
            self._layout = _layout(_state_arrays(_empty_state(self.engine.ctx.memory))[0])
        return self._layout

    def restore(self, slot_id: int, filename: str, data: bytes) -> dict[str, Any]:
        """Runs in the engine thread: checks the file, then replaces the slot's cache with it."""
        t0 = time.perf_counter()
        slot = self._slot(slot_id)
        memory = self.engine.ctx.memory
        tokens, state = decode(data, self.identity, self.kv_layout(), filename)
        if len(tokens) > self.engine.n_ctx:
            raise SlotFileError(f"slot file {filename!r} holds {len(tokens)} tokens; a slot holds {self.engine.n_ctx}")
        self.engine._forget_cache(slot)   # noqa: SLF001 -- the engine's own way to empty a slot
        memory.load_seq(slot.seq_id, _into_free_cells(memory, state))
        slot.cache_tokens, slot.n_reusable = tokens, len(tokens)
        self.engine._publish()   # noqa: SLF001 -- /slots shows the restored n_cached
        return {"id_slot": slot_id, "filename": filename, "n_restored": len(tokens), "n_read": len(data),
                "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}


def _empty_state(memory: Any) -> Any:
    """A state of no cells in ``memory``'s layout (what save_seq gives for an empty sequence)."""
    from ggflow.core.kv_cache import KVCache, KVSeqState
    from ggflow.core.kv_cache_iswa import IswaSeqState
    if hasattr(memory, "base") and hasattr(memory, "swa"):
        return IswaSeqState(_empty_state(memory.base), _empty_state(memory.swa))
    if isinstance(memory, KVCache):
        return KVSeqState(memory.size, np.zeros(0, np.int64), np.zeros(0, memory.pos.dtype),
                          np.zeros(0, memory.shift.dtype), [memory._rows(t)[:0] for t in memory.k],  # noqa: SLF001
                          [memory._rows(t)[:0] for t in memory.v])  # noqa: SLF001
    raise SlotFileError(f"this model's memory ({type(memory).__name__}) cannot be saved to a slot file")
