"""``ggflow plugins``: every registration by seam, where it came from, and the plugins that failed."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ggflow import __version__
from ggflow.plugins.manager import SEAMS, PluginManager, Registration, get_plugin_manager

SEAM_TITLES = {"architectures": "architectures", "quant_types": "tensor types",
               "backends": "backends", "samplers": "samplers"}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plugins", help="list architectures, tensor types, backends and samplers, and where each came from",
        description="List every plugin registration grouped by seam, with the distribution and version "
                    "it came from, then the plugins that failed to load.")
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="add the traceback of each failure")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = plugin_report(get_plugin_manager(), with_tracebacks=args.verbose)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


# -- the report (what --json prints) -------------------------------------------------------------
def plugin_report(manager: PluginManager, with_tracebacks: bool = False) -> dict[str, Any]:
    registries = manager.registries  # builds them, which may add hook failures: read failures after
    report: dict[str, Any] = {"ggflow_version": __version__}
    for seam in SEAMS:
        entries = [_describe(seam, reg) for reg in registries[seam]]
        entries.sort(key=(lambda e: e["type_id"]) if seam == "quant_types" else (lambda e: e["name"]))
        report[seam] = entries
    report["failures"] = [
        {"plugin": f.plugin, "distribution": f.distribution, "version": f.version,
         "error": f.error, **({"traceback": f.traceback} if with_tracebacks else {})}
        for f in manager.failures]
    return report


def _describe(seam: str, reg: Registration) -> dict[str, Any]:
    obj = reg.obj
    entry: dict[str, Any] = {
        "name": reg.name, "plugin": reg.source.plugin, "distribution": reg.source.distribution,
        "version": reg.source.version, "object": _qualified_name(obj),
        "replaces": None if reg.replaces is None else {
            "name": reg.replaces.name, "plugin": reg.replaces.source.plugin,
            "distribution": reg.replaces.source.distribution, "object": _qualified_name(reg.replaces.obj)}}
    if seam == "quant_types":
        entry.update(type_id=obj.type_id, block_size=obj.block_size, type_size=obj.type_size)
    elif seam == "backends":
        available, reason, priority = _availability(obj)
        entry.update(available=available, reason=reason, priority=priority)
    elif seam == "samplers":
        from ggflow.core.sampling_stages import describe_params
        entry.update(params=describe_params(reg.name))   # what --samplers name:param=value accepts
    return entry


def _availability(backend_cls: Any) -> tuple[bool, str, int]:
    # A backend's probe touches drivers and devices; one that crashes must not hide the others.
    default = getattr(backend_cls, "priority", 0)
    try:
        result = backend_cls.is_available()
    except Exception as exc:
        return False, f"is_available() raised {type(exc).__name__}: {exc}", default
    priority = getattr(result, "priority", None)
    return bool(result), str(getattr(result, "reason", "") or ""), default if priority is None else priority


def _qualified_name(obj: Any) -> str:
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{target.__module__}:{target.__qualname__}"


# -- the text listing ----------------------------------------------------------------------------
def format_report(report: dict[str, Any]) -> str:
    lines = [f"ggflow {report['ggflow_version']}"]
    for seam in SEAMS:
        entries = report[seam]
        lines += ["", f"{SEAM_TITLES[seam]} ({len(entries)})"]
        rows = [[e["name"], _detail(seam, e), _origin(e)] for e in entries]
        lines += _table(rows) if rows else ["  (none registered)"]
    failures = report["failures"]
    lines += ["", f"failed plugins ({len(failures)})"]
    if not failures:
        lines.append("  (none)")
    for f in failures:
        lines.append(f"  {f['plugin']} ({_origin_of(f['distribution'], f['version'])}): {f['error']}")
        if f.get("traceback"):
            lines += ["    " + line for line in f["traceback"].rstrip().splitlines()]
    return "\n".join(lines)


def _detail(seam: str, e: dict[str, Any]) -> str:
    if seam == "quant_types":
        return f"id {e['type_id']}, {e['block_size']} per {e['type_size']}-byte block"
    if seam == "backends":
        state = "available" if e["available"] else "unavailable"
        return f"{state}: {e['reason']}" if e["reason"] else state
    return ""


def _origin(e: dict[str, Any]) -> str:
    origin = f"{_origin_of(e['distribution'], e['version'])} [{e['plugin']}]"
    replaced = e.get("replaces")
    if replaced:
        origin += f", replaces {replaced['name']} from {replaced['distribution'] or 'a runtime registration'}"
    return origin


def _origin_of(distribution: str | None, version: str | None) -> str:
    if distribution is None:
        return "registered at runtime"
    return f"{distribution} {version}" if version else distribution


def _table(rows: list[list[str]]) -> list[str]:
    keep = [i for i in range(len(rows[0])) if any(row[i] for row in rows)]  # no gap for an empty column
    rows = [[row[i] for i in keep] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
