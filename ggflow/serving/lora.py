"""LoRA adapters on the server, in llama-server's shape.

``ggflow serve --lora FILE`` (scale 1) and ``--lora-scaled FILE SCALE`` load adapters, numbered 0, 1, ... in
command-line order; their scales are the default mix. ``GET /lora-adapters`` lists them as
``[{"id", "path", "scale"}]``; ``POST /lora-adapters`` with ``[{"id", "scale"}]`` sets the default mix without
reloading (adapters it leaves out get 0, as llama-server's). A generation request's ``lora: [{"id", "scale"}]``
is its own mix (the others at 0); without it, the default mix at admission. Requests with different mixes
decode in one batch (ggflow.core.lora_mix).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Sequence

from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ConfigDict, ValidationError

from ggflow.errors import GGFlowError


class LoraEntry(BaseModel):
    """One adapter of a request's mix: its id (the order of --lora / --lora-scaled) and its scale."""
    model_config = ConfigDict(strict=True, extra="forbid")
    id: int
    scale: float


def request_mix(entries: "Sequence[LoraEntry] | None") -> "dict[int, float] | None":
    """A body's ``lora`` as the engine's ``Request.lora``; an id given twice is refused."""
    if entries is None:
        return None
    mix: dict[int, float] = {}
    for e in entries:
        if e.id in mix:
            raise GGFlowError(f"lora: adapter id {e.id} is given twice")
        mix[e.id] = e.scale
    return mix


def load_adapters(ctx: Any, adapters: Sequence[tuple[str, float]]) -> None:
    """Load (path, scale) adapters for the context's model: the server's adapters and default mix."""
    from ggflow.core.lora import load_lora

    if adapters:
        ctx.set_lora([load_lora(path, ctx.model) for path, _ in adapters], [scale for _, scale in adapters])


def add_lora_routes(app: Any, state: Any) -> None:
    @app.get("/lora-adapters")
    async def lora_adapters():
        lora = state.ready().ctx.lora
        if lora is None:
            return []
        return [{"id": i, "path": a.path, "scale": float(s)} for i, (a, s) in enumerate(zip(lora.adapters,
                                                                                                lora.scales))]

    @app.post("/lora-adapters")
    async def set_lora_adapters(http: HTTPRequest):
        engine = state.ready()
        mix = request_mix(_entries(await http.body()))
        lora = engine.ctx.lora
        if lora is None:
            if mix:
                raise GGFlowError("this server has no LoRA adapters (ggflow serve --lora FILE)")
            return {"success": True}
        scales = lora.mix(mix)                    # refuses an unknown id before anything changes

        def apply() -> None:                      # in the engine thread, which reads the default mix
            lora.scales = scales
        await asyncio.wrap_future(engine.call_soon(apply))
        return {"success": True}


def _entries(raw: bytes) -> list[LoraEntry]:
    try:
        data = json.loads(raw or b"null", parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise GGFlowError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise GGFlowError("the request body must be an array of {\"id\": int, \"scale\": number}")
    entries = []
    for i, e in enumerate(data):
        try:
            entries.append(LoraEntry.model_validate(e))
        except ValidationError as exc:
            raise GGFlowError(f"invalid request: [{i}]: " + "; ".join(
                f"{'.'.join(str(p) for p in err.get('loc', ())) or 'entry'}: {err.get('msg')}"
                for err in exc.errors())) from None
    return entries


def _no_constant(name: str) -> Any:
    raise GGFlowError(f"the request body is not valid JSON: {name} is not a JSON number")
