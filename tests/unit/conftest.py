"""Fixtures the unit tests of one package share."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from supervisor.control.policy import CompiledPolicy


def _forget_decisions() -> None:
    for found in gc.get_objects():
        if isinstance(found, CompiledPolicy):
            found.l4_memo.clear()


@pytest.fixture
def cold_l4_memos() -> Iterator[None]:
    """Every compiled policy decides afresh in the test: a module-level policy remembers its decisions
    (``CompiledPolicy.l4_memo``), and mutmut forks each mutant from a process that already ran the tests once, so
    a remembered decision would hide a mutant of the code that made it (docs/design.md "Mutation testing")."""
    _forget_decisions()
    yield
    _forget_decisions()
