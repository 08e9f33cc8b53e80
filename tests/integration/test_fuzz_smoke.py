"""Ten seconds of each fuzz target under atheris (what ``make fuzz TARGET=… FUZZ_SECONDS=10`` does, on a
throwaway copy of the corpus): the worker starts, the instrumented target runs, and the inputs libFuzzer makes
in that time all pass. Longer runs are ``make fuzz`` (docs/design.md "Testing")."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None,
    reason="atheris is not installed: the test extra installs atheris==3.0.0 only on CPython 3.11 x86_64, "
    "the one platform it has a wheel for",
)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_ten_seconds_of_fuzzing_find_nothing(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz.run", name, "--smoke", "--seconds", "10"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    assert proc.stdout.startswith(f"{name}: ok, "), proc.stdout
