"""The models of a many-model server and which of them are loaded: each loaded model is its own Engine (its own
context, KV cache and thread). A request's model is loaded on first use; past ``max_loaded`` the least recently
used model with no request in flight is unloaded first; ``sleep_idle_s`` unloads a model no request has used
for that long (it is "sleeping": the next request loads it again).

The bookkeeping is under one lock held for a few lines; loads run one at a time (under a second lock) in a
worker thread, so the event loop keeps answering while a model loads.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ggflow.errors import GGFlowError
from ggflow.serving.model_config import ModelSpec

log = logging.getLogger("ggflow.serving")


class UnknownModelError(GGFlowError):
    """A request names a model this server does not offer (HTTP 404, listing the names)."""


class ModelsBusyError(GGFlowError):
    """Every loaded model has requests in flight and no more may be loaded (HTTP 503)."""


class ModelLoadFailed(GGFlowError):
    """The model's file could not be loaded (HTTP 503, with the loader's reason)."""


@dataclass
class LoadedModel:
    """A model's state: its engine while loaded, the requests using it, when it was last used."""
    spec: ModelSpec
    engine: Any = None
    in_flight: int = 0
    last_used: float = 0.0
    status: str = "unloaded"          # unloaded, loading, loaded, sleeping
    error: str | None = None          # the last load's failure
    _template: Any = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    def chat_template(self, engine: Any) -> Any:
        """The model's chat template (read from ``engine``, the one a request holds: an unload may have cleared
        ``self.engine`` meanwhile)."""
        if self._template is None:
            from ggflow.core.chat_template import ChatTemplate

            model = engine.ctx.model
            self._template = ChatTemplate.for_vocab(model.metadata.get("tokenizer.chat_template"), model.vocab)
        return self._template


def _default_loader(path: str, options: dict[str, Any]) -> Any:
    from ggflow.serving.engine import Engine

    options = dict(options)
    backends = options.pop("backends", "auto")
    if isinstance(backends, str) and backends != "auto":
        backends = [b.strip() for b in backends.split(",") if b.strip()]
    return Engine.load(path, backends=backends, **options)


class ModelPool:
    def __init__(self, specs: list[ModelSpec], *, max_loaded: int = 4, sleep_idle_s: float | None = None,
                 defaults: dict[str, Any] | None = None, loader: Callable[[str, dict], Any] = _default_loader,
                 single: bool = False):
        names = [s.name for s in specs]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise GGFlowError(f"two models are named {duplicate!r}: names must be unique")
        if max_loaded < 1:
            raise GGFlowError(f"--models-max must be at least 1, got {max_loaded}")
        self.models = {s.name: LoadedModel(s) for s in specs}
        self.max_loaded, self.sleep_idle_s = max_loaded, sleep_idle_s
        self.defaults, self.loader = dict(defaults or {}), loader
        self.single = single                 # one model (-m with --sleep-idle-seconds): any name is that model
        self._lock = threading.Lock()        # the bookkeeping
        self._load_lock = threading.Lock()   # one load (and its evictions) at a time
        self._closed = threading.Event()
        self._sleeper: threading.Thread | None = None

    # -- naming ----------------------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name: str | None) -> LoadedModel:
        """The model a request names (None: the only one, when there is one)."""
        if self.single or (name is None and len(self.models) == 1):
            return next(iter(self.models.values()))
        if name is None:
            raise GGFlowError(f"the request names no model; this server serves {', '.join(self.names)}: "
                              "set \"model\"")
        if name not in self.models:
            shown = repr(name) if len(name) <= 80 else repr(name[:77]) + "..."
            raise UnknownModelError(f"model {shown} not found; this server serves: {', '.join(self.names)}")
        return self.models[name]

    # -- use -------------------------------------------------------------------------------------------------
    async def acquire(self, name: str | None) -> LoadedModel:
        """The named model, loaded (waiting for its load), counted in flight until ``release``."""
        entry = self.get(name)
        with self._lock:
            if entry.engine is not None:
                entry.in_flight += 1
                entry.last_used = time.monotonic()
                return entry
        await asyncio.to_thread(self._load, entry, True)
        return entry

    def release(self, entry: LoadedModel) -> None:
        with self._lock:
            entry.in_flight -= 1
            entry.last_used = time.monotonic()

    def loaded(self, name: str | None) -> LoadedModel | None:
        """The named model if it is loaded (for routes that must not wake a model: /metrics, /props)."""
        entry = self.get(name)
        return entry if entry.engine is not None else None

    async def load(self, name: str) -> LoadedModel:
        entry = self.get(name)
        await asyncio.to_thread(self._load, entry, False)
        return entry

    async def unload(self, name: str) -> bool:
        """Unload the model (requests in flight on it finish first); False when it was not loaded."""
        entry = self.get(name)
        with self._lock:
            engine, entry.engine = entry.engine, None
            if engine is not None:
                entry.status = "unloaded"
        if engine is None:
            return False
        await asyncio.to_thread(self._stop, entry, engine)
        return True

    # -- loading, eviction, sleep ----------------------------------------------------------------------------
    def _load(self, entry: LoadedModel, hold: bool) -> None:
        with self._load_lock:
            with self._lock:
                if entry.engine is not None:
                    entry.in_flight += hold
                    entry.last_used = time.monotonic()
                    return
                victims = self._victims()
                entry.status = "loading"
            for victim, engine in victims:
                self._stop(victim, engine)
            try:
                path = entry.spec.resolve_path()
                engine = self.loader(path, {**self.defaults, **entry.spec.options})
                engine.start()
            except GGFlowError as exc:
                with self._lock:
                    entry.status, entry.error = "unloaded", str(exc)
                log.error("model %s failed to load: %s", entry.name, exc)
                raise ModelLoadFailed(f"model {entry.name!r} failed to load: {exc}") from None
            with self._lock:
                entry.engine, entry.status, entry.error = engine, "loaded", None
                entry.in_flight += hold
                entry.last_used = time.monotonic()
            log.warning("model loaded: %s (%s)", entry.name, path)

    def _victims(self) -> list[tuple[LoadedModel, Any]]:
        """Under the lock: detach the least recently used idle models until one more fits."""
        loaded = sorted((e for e in self.models.values() if e.engine is not None), key=lambda e: e.last_used)
        excess = len(loaded) + 1 - self.max_loaded
        if excess <= 0:
            return []
        idle = [e for e in loaded if e.in_flight == 0][:excess]
        if len(idle) < excess:
            raise ModelsBusyError(f"{len(loaded)} models are loaded (--models-max {self.max_loaded}) and all of them "
                                  "have requests in flight: try again when one is done")
        out = []
        for e in idle:
            out.append((e, e.engine))
            e.engine, e.status = None, "unloaded"
        return out

    def _stop(self, entry: LoadedModel, engine: Any) -> None:
        engine.stop(drain=True)
        entry._template = None   # it holds the vocabulary: an unloaded model keeps nothing
        log.warning("model unloaded: %s", entry.name)

    def start_sleeper(self) -> None:
        """With sleep_idle_s: a thread that puts models idle that long to sleep (unloads them)."""
        if self.sleep_idle_s is None or self._sleeper is not None:
            return
        self._sleeper = threading.Thread(target=self._sleep_loop, name="ggflow-sleep", daemon=True)
        self._sleeper.start()

    def _sleep_loop(self) -> None:
        period = min(max(self.sleep_idle_s / 4, 0.05), 1.0)
        while not self._closed.wait(period):
            now = time.monotonic()
            with self._lock:
                sleepy = [(e, e.engine) for e in self.models.values()
                          if e.engine is not None and e.in_flight == 0 and now - e.last_used >= self.sleep_idle_s]
                for e, _ in sleepy:
                    e.engine, e.status = None, "sleeping"
            for e, engine in sleepy:
                self._stop(e, engine)

    def close(self) -> None:
        """Stop every engine (requests in flight finish) and the sleep thread."""
        self._closed.set()
        with self._lock:
            running = [(e, e.engine) for e in self.models.values() if e.engine is not None]
            for e, _ in running:
                e.engine, e.status = None, "unloaded"
        for e, engine in running:
            self._stop(e, engine)
        if self._sleeper is not None:
            self._sleeper.join(5)

    # -- what /v1/models says --------------------------------------------------------------------------------
    def listing(self, created: int) -> list[dict[str, Any]]:
        with self._lock:
            rows = []
            for e in self.models.values():
                status: dict[str, Any] = {"value": e.status}
                if e.error is not None:
                    status.update(failed=True, error=e.error)
                rows.append({"id": e.name, "object": "model", "created": created, "owned_by": "ggflow",
                             "path": e.spec.path or f"hf:{e.spec.hf}", "status": status, "in_flight": e.in_flight})
            return rows
