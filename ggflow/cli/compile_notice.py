"""Say so while numba compiles kernels, instead of a silent minute on the first run.

numba announces each compilation through its event API ("numba:compile", numba.core.event), with no
kernel edited: the listener prints one line at the first compilation (a tqdm bar naming each kernel on a
terminal) and counts the seconds spent, so a command can tell compile time apart from its own timings.
Loads from numba's on-disk cache fire no event: a warm run prints nothing.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

_active: "CompileNotice | None" = None


def compile_seconds() -> float:
    """Seconds spent compiling kernels in this process while a notice listened (0.0 where none did)."""
    return _active.seconds if _active is not None else 0.0


def end_progress() -> None:
    """Take the progress bar off the terminal before a command prints to stdout (compiles go on counting)."""
    if _active is not None:
        _active.end_progress()


def kernel_name(dispatcher: Any) -> str:
    func = getattr(dispatcher, "py_func", None)
    if func is None:
        return str(dispatcher)
    module = func.__module__.removeprefix("ggflow.backends_builtin.")
    return f"{module}.{func.__qualname__}"


def cache_dir_of(dispatcher: Any) -> str | None:
    cache = getattr(dispatcher, "_cache", None)
    return getattr(cache, "_cache_path", None)


class CompileNotice:
    """Context manager: listens to numba's compile events while a command runs."""

    def __init__(self, stream: TextIO = sys.stderr):
        self.stream = stream
        self.seconds = 0.0
        self.kernels = 0
        self._depth = 0        # nested compiles (a kernel compiling the functions it calls) count once
        self._t0 = 0.0
        self._announced = False
        self._bar: Any = None
        self._listener: Any = None

    def __enter__(self) -> "CompileNotice":
        global _active
        from numba.core import event

        notice = self

        class Listener(event.Listener):
            def on_start(self, ev: Any) -> None:
                notice._started(ev.data["dispatcher"])

            def on_end(self, ev: Any) -> None:
                notice._ended(ev.data["dispatcher"])

        self._listener = Listener()
        event.register("numba:compile", self._listener)
        _active = self
        return self

    def __exit__(self, *exc: Any) -> None:
        global _active
        from numba.core import event

        event.unregister("numba:compile", self._listener)
        self.end_progress()
        _active = None

    def end_progress(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _started(self, dispatcher: Any) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        self._t0 = time.perf_counter()
        if not self._announced:
            self._announced = True
            self._announce(dispatcher)
        if self._bar is not None:
            self._bar.set_postfix_str(kernel_name(dispatcher), refresh=True)

    def _ended(self, dispatcher: Any) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        self.seconds += time.perf_counter() - self._t0
        self.kernels += 1
        if self._bar is not None:
            self._bar.update(1)

    def _announce(self, dispatcher: Any) -> None:
        where = cache_dir_of(dispatcher)
        line = (f"ggflow: compiling CPU kernels with numba, starting with {kernel_name(dispatcher)} "
                f"(once: they are cached{f' in {where}' if where else ''}; `ggflow warmup` does it ahead)")
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(desc="compiling kernels (first run only)", unit=" kernels", file=self.stream,
                             leave=False, dynamic_ncols=True)
        else:
            self.stream.write(line + "\n")  # one write: a Ctrl-C cannot land between the line and its end
            self.stream.flush()
