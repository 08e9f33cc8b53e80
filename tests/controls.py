"""Protection-off twins (``make test-controls``): an attacker-side test run with the one check it proves patched
away must fail, and fail on its own assertion — so a test that would pass without the protection, or a twin that
breaks on a fixture, an import or a timeout, shows up as a failure.

``@protection_off("…")`` marks a twin: ``xfail(strict=True, raises=AssertionError)``, collected only with
``--controls`` (and then alone). A ``pytest.raises`` that did not raise is the assertion of its test, so it
counts as an ``AssertionError`` too; every other exception stays a failure of the twin.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

F = TypeVar("F", bound=Callable[..., Any])


def _as_assertion(protection: str, exc: BaseException) -> AssertionError | None:
    if isinstance(exc, pytest.fail.Exception) and str(exc).startswith("DID NOT RAISE"):
        return AssertionError(f"with {protection} off: {exc}")
    return None


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception at the leaves of ``group`` (nested groups included), else the group itself: a twin that
    failed on its assertion alone counts; one that failed on anything besides stays a failure."""
    leaves: list[BaseException] = []
    todo: list[BaseException] = [group]
    while todo:
        exc = todo.pop()
        if isinstance(exc, BaseExceptionGroup):
            todo.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else group


def protection_off(protection: str) -> Callable[[F], F]:
    """Mark a twin whose test runs with ``protection`` patched away (its fixture says how)."""

    def wrap(test: F) -> F:
        if inspect.iscoroutinefunction(test):

            @functools.wraps(test)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await test(*args, **kwargs)
                except pytest.fail.Exception as exc:
                    raise (_as_assertion(protection, exc) or exc) from None

            runner: Any = run_async
        else:

            @functools.wraps(test)
            def run(*args: Any, **kwargs: Any) -> Any:
                try:
                    return test(*args, **kwargs)
                except pytest.fail.Exception as exc:
                    raise (_as_assertion(protection, exc) or exc) from None

            runner = run
        runner = pytest.mark.protection_off(runner)
        marked: F = pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"protection off: {protection}")(
            runner
        )
        return marked

    return wrap
