"""Paths never writable by the agent: ``/`` and ``/proc`` (one table, shared by policy, boundary and dev)."""

from __future__ import annotations

import pytest

from supervisor.protocol.writable_paths import normalize, writable_problem

CASES = [
    ("/", "root"),
    ("//", "root"),
    ("/./", "root"),
    ("/proc", "/proc"),
    ("/proc/", "/proc"),
    ("//proc/./self/mem", "/proc"),
    ("/proc/sys/kernel", "/proc"),
    ("/procfs", None),
    ("/tmp/proc", None),
    ("/home/agent/work", None),
]


@pytest.mark.parametrize(("path", "word"), CASES)
def test_writable_problem(path: str, word: str | None) -> None:
    problem = writable_problem(path)
    if word is None:
        assert problem is None
    else:
        assert problem is not None and word in problem


def test_normalize() -> None:
    assert normalize("//a/./b//") == "/a/b"
