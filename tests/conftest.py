"""The whole run's sandboxes and clients live in directories of the run's own.

A CLI client without ``--api`` or ``OPENSHELL_SANDBOX_API`` looks for "the running sandbox" under
the runtime directory (docs/design.md "Finding the API"), and dev mode keeps its events and
default workdir under ``$XDG_STATE_HOME``. On a machine where another sandbox runs, a test could then ask that one,
or pass without asking its own. So for the whole session: ``XDG_RUNTIME_DIR`` and ``XDG_STATE_HOME`` are fresh
0700 directories of this run (removed after it), and ``OPENSHELL_SANDBOX_API`` is unset. Tests that need their own
directories (per test, or for a daemon run as another uid) still set them themselves.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controls import sole_exception

_NAMES = ("XDG_RUNTIME_DIR", "XDG_STATE_HOME", "OPENSHELL_SANDBOX_API")


@pytest.fixture(scope="session", autouse=True)
def _the_runs_own_runtime_and_state_dirs() -> Iterator[None]:
    # Under /tmp and short: a dev sandbox's API socket path must fit in a Unix socket's 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="ost-", dir="/tmp"))
    runtime, state = root / "run", root / "state"
    for directory in (runtime, state):
        directory.mkdir(mode=0o700)
        os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask
    saved = {name: os.environ.get(name) for name in _NAMES}
    os.environ["XDG_RUNTIME_DIR"], os.environ["XDG_STATE_HOME"] = str(runtime), str(state)
    os.environ.pop("OPENSHELL_SANDBOX_API", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(root, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--controls", action="store_true",
        help="run only the protection-off twins (tests/controls.py; make test-controls)",
    )  # fmt: skip


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A twin of an async test fails inside pytest-trio's nursery, which wraps its assertion in an exception group:
    the one exception it holds is the twin's outcome (tests/controls.py)."""
    try:
        return (yield)
    except BaseExceptionGroup as group:
        if item.get_closest_marker("protection_off") is None:
            raise
        raise sole_exception(group) from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``make test`` leaves the protection-off twins out; ``--controls`` runs them alone."""
    controls = config.getoption("--controls")
    keep, dropped = [], []
    for item in items:
        (keep if (item.get_closest_marker("protection_off") is not None) == controls else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
