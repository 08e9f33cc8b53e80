"""Waiting on a condition, never for a fixed time (docs/design.md "Testing": no sleeps as synchronisation).

``wait_until(check, what)`` polls ``check()`` until it returns something truthy and returns that value; at the
deadline it raises ``AssertionError`` naming ``what`` (and the last value seen), so a failure says what never
happened. ``await_until`` is the same inside trio. The deadline is a budget for a loaded machine, not a
measurement: a test that needs a bound on *how fast* something happens asserts that bound itself.

    wait_until(lambda: path.exists(), "the server's ready file")
    members = await await_until(lambda: [p for p in scan().live if comm(p.pid) == "sleep"], "both sleeps")
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import trio

__all__ = ["DEFAULT_TIMEOUT_S", "await_until", "wait_until"]

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 30.0


def _failed(what: str, within_s: float, last: object) -> AssertionError:
    return AssertionError(f"{what}: not within {within_s:g} s (last seen: {last!r})"[:2000])


def wait_until(check: Callable[[], T], what: str, *, within_s: float = DEFAULT_TIMEOUT_S, interval: float = 0.02) -> T:
    """Poll ``check`` (blocking) until its value is truthy; that value."""
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failed(what, within_s, value)
        time.sleep(interval)


async def await_until(
    check: Callable[[], T], what: str, *, within_s: float = DEFAULT_TIMEOUT_S, interval: float = 0.01
) -> T:
    """Poll ``check`` from trio until its value is truthy; that value. The deadline is trio's clock (a
    ``MockClock`` with autojump makes polling free)."""
    deadline = trio.current_time() + within_s
    while True:
        value = check()
        if value:
            return value
        if trio.current_time() >= deadline:
            raise _failed(what, within_s, value)
        await trio.sleep(interval)
