"""Which models a many-model server offers: every GGUF of ``--models-dir`` or the models a ``--models-config`` file
(JSON or TOML) names, each with the ``Engine.load`` options it runs with.

A config file::

    [defaults]               # optional: options for every model (the command line's are below these)
    ctx-size = 4096

    [models.smol]            # the name requests use as "model"
    model = "smol.gguf"      # a path (relative to the file's folder), or: hf = "user/repo:Q4_K_M"
    parallel = 2
    load-on-startup = true

Option names are ``ggflow serve``'s long flags without dashes (``ctx-size`` or ``ctx_size``); an unknown one is
refused naming it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ggflow.errors import GGFlowError

# ggflow serve's flag (without dashes) -> (Engine.load's keyword, the type its value must have)
ENGINE_OPTIONS: dict[str, tuple[str, type]] = {
    "ctx-size": ("n_ctx", int), "parallel": ("n_slots", int), "batch-size": ("n_batch", int),
    "ubatch-size": ("n_ubatch", int), "threads": ("n_threads", int), "max-queue": ("max_queue", int),
    "cache-type-k": ("type_k", str), "cache-type-v": ("type_v", str), "context-shift": ("context_shift", bool),
    "keep": ("n_keep", int), "backend": ("backends", str),
}
_OTHER_KEYS = {"model", "hf", "load-on-startup"}


class ModelConfigError(GGFlowError):
    """A models folder or config file that does not say which models to serve, or says it wrongly."""


@dataclass
class ModelSpec:
    """One model a request may name: where its file is (or the Hub spec to fetch it) and its engine options."""
    name: str
    path: str | None = None
    hf: str | None = None
    options: dict[str, Any] = field(default_factory=dict)    # Engine.load keywords
    load_on_startup: bool = False

    def resolve_path(self) -> str:
        if self.path is None:
            from ggflow.api.hub import resolve_hf

            self.path = resolve_hf(self.hf)
        return self.path


def _model_files(names: list[str]) -> list[str]:
    """The GGUF model files among ``names`` (a split model by its first shard; projectors left out)."""
    from ggflow.api.hub import is_model_file, split_info

    return sorted(n for n in names if is_model_file(n) and split_info(n)[1] == 1)


def specs_from_dir(folder: str) -> list[ModelSpec]:
    """Every model of a folder: a GGUF file is named by its stem (a split one by the part before -00001-of-N),
    a subfolder holding a model (its shards, or a model with its projector) by the subfolder's name."""
    from ggflow.api.hub import split_info

    if not os.path.isdir(folder):
        raise ModelConfigError(f"--models-dir {folder!r} is not a folder")
    specs = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isdir(path):
            files = _model_files(os.listdir(path))
            if files:
                specs.append(ModelSpec(entry, os.path.join(path, files[0])))
        elif _model_files([entry]):
            specs.append(ModelSpec(split_info(entry)[0].removesuffix(".gguf").removesuffix(".GGUF"), path))
    if not specs:
        raise ModelConfigError(f"--models-dir {folder!r} holds no GGUF model files")
    return specs


def specs_from_config(path: str) -> list[ModelSpec]:
    """The models a JSON or TOML file names (see the module docstring)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ModelConfigError(f"--models-config {path!r}: {exc.strerror or exc}") from None
    try:
        if path.lower().endswith(".json"):
            data = json.loads(raw)
        else:
            import tomllib

            data = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"--models-config {path!r} is not valid {'JSON' if path.endswith('.json') else 'TOML'}:"
                               f" {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict) or not data["models"]:
        raise ModelConfigError(f"--models-config {path!r} names no models: expected a 'models' table of "
                               "name -> {model = PATH or hf = REPO, options...}")
    unknown = sorted(set(data) - {"models", "defaults"})
    if unknown:
        raise ModelConfigError(f"--models-config {path!r}: unknown top-level key {unknown[0]!r}; "
                               "accepted: models, defaults")
    defaults = _options(data.get("defaults", {}), "defaults", path, allow_model=False)
    base = os.path.dirname(os.path.abspath(path))
    specs = []
    for name, section in data["models"].items():
        own = _options(section, f"models.{name}", path, allow_model=True)
        model, hf = own.pop("model", None), own.pop("hf", None)
        if (model is None) == (hf is None):
            raise ModelConfigError(f"--models-config {path!r}: models.{name} needs exactly one of model (a path) "
                                   "or hf (user/repo[:quant])")
        startup = bool(own.pop("load-on-startup", False))
        options = {ENGINE_OPTIONS[k][0]: v for k, v in {**defaults, **own}.items()}
        specs.append(ModelSpec(name, os.path.join(base, model) if model else None, hf, options, startup))
    return specs


def _options(section: Any, where: str, path: str, allow_model: bool) -> dict[str, Any]:
    if not isinstance(section, dict):
        raise ModelConfigError(f"--models-config {path!r}: {where} must be a table of options")
    out = {}
    for key, value in section.items():
        name = str(key).replace("_", "-")
        if name in _OTHER_KEYS and allow_model:
            if name != "load-on-startup" and not isinstance(value, str):
                raise ModelConfigError(f"--models-config {path!r}: {where}.{key} must be a string")
            out[name] = value
            continue
        if name not in ENGINE_OPTIONS:
            accepted = sorted(ENGINE_OPTIONS) + (sorted(_OTHER_KEYS) if allow_model else [])
            raise ModelConfigError(f"--models-config {path!r}: unknown option {where}.{key}; accepted: "
                                   f"{', '.join(accepted)}")
        kind = ENGINE_OPTIONS[name][1]
        if type(value) is not kind:   # type(): a TOML true is not the integer 1
            raise ModelConfigError(f"--models-config {path!r}: {where}.{key} = {value!r} must be "
                                   f"{'an integer' if kind is int else 'a boolean' if kind is bool else 'a string'}")
        if kind is int and value < {"max-queue": 0, "keep": -1}.get(name, 1):
            raise ModelConfigError(f"--models-config {path!r}: {where}.{key} = {value} is out of range")
        out[name] = value
    return out
