"""Tests that walk the tree see the tracked files only (``tests/tracked.py``): a third-party module under an
ignored ``bench/.venv-peers`` (what ``make bench`` leaves) is not one of them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.tracked import ROOT, tracked


def test_an_ignored_directory_in_the_checkout_is_not_walked() -> None:
    peers = ROOT / "bench" / f".venv-peers-test-{os.getpid()}"
    (peers / "site").mkdir(parents=True)
    try:
        (peers / "site" / "third_party.py").write_text("CITES = 'docs/nowhere.md'\n")
        walked = tracked("bench", "tests")
        assert not any(peers in path.parents for path in walked)
        assert Path(__file__).resolve() in walked and len(walked) > 100
    finally:
        shutil.rmtree(peers)
