"""The protection-off daemons of the twins (tests/controls_daemon.py) are out of the product's reach: nothing the
daemons read can name them, and the installed package does not hold them."""

from __future__ import annotations

import tomllib

from tests import controls_daemon
from tests.tracked import ROOT, tracked


def test_no_product_file_names_the_hook() -> None:
    for path in tracked("supervisor", suffix=""):
        assert "controls_daemon" not in path.read_text(errors="replace"), path


def test_the_installed_package_is_the_supervisor_package_alone() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["supervisor*"]


def test_the_hook_is_a_separate_program_that_runs_the_daemons_own_main() -> None:
    argv = controls_daemon.argv("fence-watch")
    assert argv[1] == "-c" and "tests.controls_daemon" in argv[2] and argv[3] == "fence-watch"
