"""Stop strings found in streamed text, without ever releasing part of one."""
from __future__ import annotations

from typing import Sequence


class StopMatcher:
    """Finds stop strings in streamed text, holding back any tail that could still become one.

    A stop string split across tokens ("<|e" + "nd|>") is never emitted in part: text is released
    only once no stop string can start inside it.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.text = ""        # everything released so far (the completion's text)
        self._held = ""
        self.hit = False

    def push(self, piece: str, final: bool = False) -> tuple[str, bool]:
        """Add text; return (text safe to release, whether a stop string was found)."""
        if self.hit:
            return "", True
        held = self._held + piece
        cut = min((i for i in (held.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            release, self._held = held[:cut], ""
        elif final:
            release, self._held = held, ""
        else:
            keep = max((k for s in self.stops for k in range(min(len(s) - 1, len(held)), 0, -1)
                        if held.endswith(s[:k])), default=0)
            release, self._held = held[: len(held) - keep], held[len(held) - keep:]
        self.text += release
        return release, self.hit
