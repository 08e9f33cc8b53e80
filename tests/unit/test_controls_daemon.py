"""The protection-off daemons of the twins (tests/controls_daemon.py, and dev mode starting them:
tests/controls_dev.py) are out of the product's reach: nothing the daemons read can name them, and the installed
package does not hold them."""

from __future__ import annotations

import tomllib

from tests import controls_daemon, controls_dev
from tests.tracked import ROOT, tracked


def test_no_product_file_names_the_hook() -> None:
    for path in tracked("supervisor", suffix=""):
        text = path.read_text(errors="replace")
        assert "controls_daemon" not in text and "controls_dev" not in text, path


def test_the_installed_package_is_the_supervisor_package_alone() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["supervisor*"]


def test_the_hook_is_a_separate_program_that_runs_the_daemons_own_main() -> None:
    argv = controls_daemon.argv("fence-watch")
    assert argv[1] == "-c" and "tests.controls_daemon" in argv[2] and argv[3] == "fence-watch"


def test_the_dev_hook_is_a_separate_program_that_runs_the_clis_own_main() -> None:
    argv = controls_dev.argv("exec-log-child")
    assert argv[1] == "-c" and "tests.controls_dev" in argv[2] and argv[3] == "exec-log-child"


def test_the_dev_hook_replaces_the_entry_dev_mode_imported() -> None:
    """The name the hook replaces is the one dev mode's command builders call, so the daemons it starts are the
    patched ones."""
    from supervisor.cli import dev, dev_common

    assert dev._entry is dev_common._entry
