"""A Jinja sandbox with a budget: a chat template from a GGUF file is code from a stranger.

jinja2's ImmutableSandboxedEnvironment stops attribute escapes (``__class__``, ``__globals__``, ...) and
mutation, but not a template that never ends (two nested loops over ``range(100000)``), nor one that
builds a string of gigabytes by doubling it. Here every operation the template performs ticks a
budget: each loop iteration (every ``{% for %}`` iterates through ``_budgeted_iter``, put there by
rewriting the parsed template), call, attribute or item access, filter and intercepted operator.
The budget ends the render after ``max_ops`` operations or ``max_seconds``; a string, list or integer
result larger than ``max_chars`` (or an integer argument that large, which would allocate as much:
``"x" | center(10**10)``), and output longer than it, end it too. Exceeding it raises
BudgetExceeded, which the caller turns into a ChatTemplateError.
"""
from __future__ import annotations

import functools
import math
import time
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator

from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer


@dataclass(frozen=True)
class TemplateBudget:
    """How much one render may do, for a conversation of one message; ``for_messages`` grows it.

    A real template renders a short conversation in a few thousand operations, and some (gemma-4's)
    compare every message with every other: ~n**2 operations for n messages, ~5 s for 1000 of them on
    a slow machine. So the allowance grows with the square of the conversation, and the time with its
    length; a template that loops 10**10 times on one message still ends within max_seconds.
    """
    max_ops: int = 1_000_000
    max_seconds: float = 2.0
    max_chars: int = 8_000_000
    ops_per_message_squared: int = 4
    seconds_per_message: float = 0.02

    def for_messages(self, n: int) -> "TemplateBudget":
        return replace(self, max_ops=self.max_ops + self.ops_per_message_squared * n * n,
                       max_seconds=self.max_seconds + self.seconds_per_message * n)


class BudgetExceeded(Exception):
    """A render ran past its TemplateBudget."""


class _Meter:
    __slots__ = ("budget", "ops", "deadline")

    def __init__(self, budget: TemplateBudget):
        self.budget, self.ops = budget, 0
        self.deadline = time.monotonic() + budget.max_seconds

    def tick(self) -> None:
        self.ops += 1
        if self.ops > self.budget.max_ops:
            raise BudgetExceeded(f"more than {self.budget.max_ops} operations")
        if not self.ops & 1023 and time.monotonic() > self.deadline:
            raise BudgetExceeded(f"more than {self.budget.max_seconds} s")

    def check_size(self, value: Any) -> Any:
        if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > self.budget.max_chars:
            raise BudgetExceeded(f"a value of {len(value)} items (the limit is {self.budget.max_chars})")
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4096:
            raise BudgetExceeded("an integer of more than 4096 bits")
        return value

    def check_args(self, args: Iterable[Any]) -> None:
        for a in args:
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.budget.max_chars:
                raise BudgetExceeded(f"an integer argument {a} larger than the size limit")


_meter: ContextVar[_Meter | None] = ContextVar("ggflow_template_meter", default=None)


def _current() -> _Meter:
    meter = _meter.get()
    if meter is None:   # rendering outside render_budgeted: an unlimited meter, still size-checked
        meter = _Meter(TemplateBudget(max_ops=2**62, max_seconds=math.inf))
        _meter.set(meter)
    return meter


def _budgeted_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    meter = _current()
    for item in iterable:
        meter.tick()
        yield item


def _budgeted_concat(*parts: Any) -> str:
    meter = _current()
    meter.tick()
    texts = [str(p) for p in parts]
    if sum(map(len, texts)) > meter.budget.max_chars:
        raise BudgetExceeded(f"a string longer than {meter.budget.max_chars} characters")
    return "".join(texts)


def _binop_size_ok(meter: _Meter, op: str, left: Any, right: Any) -> None:
    """Refuse before computing what would take too long or too much memory to compute."""
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right))
    if op == "**" and ints and right > 0 and abs(left) > 1 and right * math.log2(abs(left)) > 4096:
        raise BudgetExceeded(f"{left} ** {right} has more than 4096 bits")
    if op == "*":
        if ints and left.bit_length() + right.bit_length() > 4096:
            raise BudgetExceeded("a product of more than 4096 bits")
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > meter.budget.max_chars:
                raise BudgetExceeded(f"a sequence of {len(seq)} items repeated {n} times")
    if op == "+" and all(isinstance(x, (str, list, tuple)) for x in (left, right)):
        if len(left) + len(right) > meter.budget.max_chars:
            raise BudgetExceeded(f"a sequence longer than {meter.budget.max_chars} items")


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose every operation ticks the current render's budget."""

    # intercepted, so that Jinja neither folds them at compile time nor computes them unchecked
    intercepted_binops = frozenset({"*", "**", "+", "//", "%"})

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.globals["_ggflow_iter"] = _budgeted_iter
        self.globals["_ggflow_concat"] = _budgeted_concat
        self.filters = {name: _budgeted_filter(name, f) for name, f in self.filters.items()}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = _Metering().visit(super()._parse(source, name, filename))
        tree.set_environment(self)
        return tree

    def add_filter(self, name: str, func: Any) -> None:
        self.filters[name] = _budgeted_filter(name, func)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        meter = _current()
        meter.tick()
        meter.check_args(args)
        meter.check_args(kwargs.values())
        return meter.check_size(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        meter = _current()
        meter.tick()
        _binop_size_ok(meter, op, left, right)
        if op == "%" and isinstance(left, str):
            meter.check_args(right if isinstance(right, tuple) else (right,))
            _check_format_widths(meter, left)
        return meter.check_size(super().call_binop(context, op, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _current().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _current().tick()
        return super().getitem(obj, argument)

    def wrap_str_format(self, value: Any) -> Any:
        """``"{:>99999999}".format(x)`` is checked for its widths before the sandbox's formatter runs."""
        formatter = super().wrap_str_format(value)
        if formatter is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format_widths(_current(), fmt)
            return formatter(*args, **kwargs)
        return checked


class _Metering(NodeTransformer):
    """Every loop iterates through _ggflow_iter; every ``a ~ b`` is a call to _ggflow_concat."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = _call("_ggflow_iter", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        node = self.generic_visit(node)
        return _call("_ggflow_concat", node.nodes, node.lineno)


def _call(name: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
    return nodes.Call(nodes.Name(name, "load"), args, [], None, None).set_lineno(lineno)


def _check_format_widths(meter: _Meter, fmt: str) -> None:
    """``"%99999999s" % x`` and ``"{:>99999999}".format(x)`` allocate their width before returning."""
    digits = 0
    for ch in fmt:
        digits = digits + 1 if ch.isdigit() else 0
        if digits > len(str(meter.budget.max_chars)):
            raise BudgetExceeded("a format width beyond the size limit")


def _budgeted_filter(name: str, func: Any) -> Any:
    @functools.wraps(func)   # keeps jinja_pass_arg (pass_context / pass_environment) on the wrapper
    def run(*args: Any, **kwargs: Any) -> Any:
        meter = _current()
        meter.tick()
        meter.check_args(args)
        meter.check_args(kwargs.values())
        if name == "format":   # "%99999999s" | format(x)
            for a in args:
                if isinstance(a, str):
                    _check_format_widths(meter, a)
        return meter.check_size(func(*args, **kwargs))
    return run


def render_budgeted(template: Any, budget: TemplateBudget, variables: dict[str, Any]) -> str:
    """Render ``template`` (from a BudgetedSandbox) within ``budget``; BudgetExceeded past it."""
    token = _meter.set(_Meter(budget))
    try:
        out, n = [], 0
        for chunk in template.generate(**variables):
            n += len(chunk)
            if n > budget.max_chars:
                raise BudgetExceeded(f"output longer than {budget.max_chars} characters")
            out.append(chunk)
        return "".join(out)
    finally:
        _meter.reset(token)


__all__ = ["BudgetExceeded", "BudgetedSandbox", "TemplateBudget", "render_budgeted"]
