from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _needs_root_for_dev_mode() -> None:
    if os.geteuid() != 0:
        pytest.skip("dev-mode e2e tests run the boundary in model R (root); this run is not root")
