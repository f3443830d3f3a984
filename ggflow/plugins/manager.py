"""One plugin manager: entry-point discovery, per-plugin failure isolation, and the four registries.

Every plugin, built-in or third-party, is a module (or object) with ``@hookimpl`` functions, found
through the ``ggflow`` entry-point group. A plugin that fails to import, or raises inside a hook, is
recorded in ``failures`` and the rest still load. ``GGFLOW_DISABLE_PLUGIN_AUTOLOAD=1`` loads only
the entry points of the ggflow distribution itself.
"""
from __future__ import annotations

import os
import threading
import traceback
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Generic, Iterator, TypeVar

import pluggy

from ggflow.errors import PluginError, UnknownNameError
from ggflow.plugins import hookspecs
from ggflow.plugins.api_version import check_plugin_api

T = TypeVar("T")
SEAMS = {  # seam -> (hook name, what one registration is called in messages)
    "architectures": ("register_architectures", "architecture"),
    "quant_types": ("register_quant_types", "tensor type"),
    "backends": ("register_backends", "backend"),
    "samplers": ("register_samplers", "sampler"),
}


@dataclass(frozen=True)
class Source:
    """Where a registration came from."""
    plugin: str
    distribution: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Registration(Generic[T]):
    name: str
    obj: T
    source: Source
    replaces: "Registration[T] | None" = None   # the registration of the same name this one overrode


class PluginOverrideWarning(UserWarning):
    """A plugin registered a name another registration already had: the later one wins."""


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    distribution: str | None
    error: str          # one line: the exception type and message
    traceback: str
    version: str | None = None


class Registry(Generic[T]):
    """Name -> registered object for one seam. A miss names what exists."""

    def __init__(self, kind: str):
        self.kind = kind
        self._by_name: dict[str, Registration[T]] = {}

    def add(self, name: str, obj: T, source: Source) -> None:
        """Register ``obj`` under ``name``; a name already taken is replaced, with a warning that says by whom."""
        previous = self._by_name.get(name)
        if previous is not None:
            warnings.warn(f"{self.kind} {name!r} from {_origin(source)} replaces the one from "
                          f"{_origin(previous.source)}", PluginOverrideWarning, stacklevel=2)
        self._by_name[name] = Registration(name, obj, source, previous)

    def get(self, name: str) -> T:
        return self.registration(name).obj

    def registration(self, name: str) -> Registration[T]:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, list(self._by_name)) from None

    def names(self) -> list[str]:
        return list(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Registration[T]]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)


def _origin(source: Source) -> str:
    where = source.distribution or "a plugin registered at runtime"
    return f"{where} [{source.plugin}]"


def _is_own(ep: metadata.EntryPoint) -> bool:
    return ep.dist is not None and ep.dist.name.lower() == "ggflow"


def _names_of(obj: Any) -> tuple[str, ...]:
    names = getattr(obj, "names", None) or (getattr(obj, "name", None),)
    if isinstance(names, str):  # names = "llama" is one name, not five
        names = (names,)
    if not all(isinstance(n, str) and n for n in names):
        raise PluginError(f"registered object {obj!r} has no 'name' (or 'names') to register it under")
    return tuple(names)


class PluginManager:
    def __init__(self, autoload: bool = True):
        self.pm = pluggy.PluginManager("ggflow")
        self.pm.add_hookspecs(hookspecs)
        self._load_failures: list[PluginFailure] = []   # imports and registrations: kept
        self._hook_failures: list[PluginFailure] = []   # raised in hooks: redone with the registries
        self._sources: dict[int, Source] = {}   # id(plugin object) -> where it came from
        self._registries: dict[str, Registry] | None = None
        self._lock = threading.RLock()
        if autoload:
            self.load_entry_points()

    # -- discovery ---------------------------------------------------------------------------
    def load_entry_points(self) -> None:
        builtins_only = os.environ.get("GGFLOW_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0")
        eps = metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
        seen_own = False
        # ggflow's own plugins first, so a third-party registration of the same name overrides a built-in.
        for ep in sorted(eps, key=lambda e: (not _is_own(e), e.dist.name if e.dist else "", e.name)):
            dist = ep.dist.name if ep.dist else None
            own = _is_own(ep)
            seen_own |= own
            if builtins_only and not own:
                continue
            source = Source(ep.name, dist, ep.dist.version if ep.dist else None)
            try:
                # register() fails too when a hookimpl's signature doesn't match its spec.
                self.register(ep.load(), source)
            except Exception as exc:
                self._fail(source, exc)
        if not seen_own:
            self._load_failures.append(PluginFailure(
                "ggflow", None, "the ggflow distribution's entry points were not found: "
                "install the package (pip install -e .) so its built-in plugins can be discovered", ""))

    def register(self, plugin: Any, source: Source | str | None = None) -> None:
        """Add a plugin object (a module or an instance with @hookimpl methods); one declaring another major
        GGFLOW_API_VERSION is refused (api_version.check_plugin_api)."""
        with self._lock:
            if isinstance(source, str) or source is None:
                source = Source(source or getattr(plugin, "__name__", type(plugin).__name__))
            if self.pm.is_registered(plugin):
                return
            check_plugin_api(plugin, f"plugin {_origin(source)}")
            self.pm.register(plugin, name=f"{source.distribution or '-'}:{source.plugin}:{id(plugin)}")
            self._sources[id(plugin)] = source
            self._registries = None

    def unregister(self, plugin: Any) -> None:
        with self._lock:
            if not self.pm.is_registered(plugin):  # idempotent, like register (pluggy would assert)
                return
            self.pm.unregister(plugin)
            self._sources.pop(id(plugin), None)
            self._registries = None

    def _fail(self, source: Source, exc: BaseException) -> None:
        self._load_failures.append(PluginFailure(
            source.plugin, source.distribution, f"{type(exc).__name__}: {exc}",
            "".join(traceback.format_exception(exc)), source.version))

    # -- registries --------------------------------------------------------------------------
    @property
    def registries(self) -> dict[str, Registry]:
        with self._lock:
            if self._registries is None:
                self._registries = self._build_registries()
            return self._registries

    def _build_registries(self) -> dict[str, Registry]:
        self._hook_failures = []
        registries = {}
        for seam, (hook_name, kind) in SEAMS.items():
            registry: Registry = Registry(kind)
            # get_hookimpls() is in registration order (pluggy *calls* them in reverse): walking it
            # forward lets a later plugin override an earlier one's name.
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                source = self._sources.get(id(impl.plugin), Source(impl.plugin_name))
                collected: list[Any] = []
                try:
                    impl.function(register=collected.append)
                    named = [(name, obj) for obj in collected for name in _names_of(obj)]
                except Exception as exc:
                    self._hook_failures.append(PluginFailure(
                        source.plugin, source.distribution, f"in hook {hook_name}: {type(exc).__name__}: {exc}",
                        "".join(traceback.format_exception(exc)), source.version))
                    continue
                for name, obj in named:
                    registry.add(name, obj, source)
            registries[seam] = registry
        return registries

    @property
    def failures(self) -> list[PluginFailure]:
        """Plugins that failed to import, to register, or inside a hook (which only running the hooks shows)."""
        with self._lock:
            self.registries  # noqa: B018  (builds them if stale: hook failures show only when hooks run)
            return [*self._load_failures, *self._hook_failures]

    @property
    def architectures(self) -> Registry: return self.registries["architectures"]
    @property
    def quant_types(self) -> Registry: return self.registries["quant_types"]
    @property
    def backends(self) -> Registry: return self.registries["backends"]
    @property
    def samplers(self) -> Registry: return self.registries["samplers"]


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, created (and entry points loaded) on first use."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = PluginManager()
        return _manager


def reset_plugin_manager() -> None:
    """Forget the process-wide manager, so the next use rediscovers entry points (tests, after pip)."""
    global _manager
    with _manager_lock:
        _manager = None


def registries() -> dict[str, Registry]:
    return get_plugin_manager().registries
