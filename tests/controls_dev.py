"""``openshell-sandbox dev`` whose daemons run with one protection patched away, for the twin of an end-to-end
attack.

Dev mode builds its daemons' command itself (``supervisor/cli/dev_common.py`` ``_entry``). ``argv(protection)``
is the command a twin runs in place of ``python -m supervisor.cli`` (dev's own arguments follow): a separate
program of the test suite that, in its own process, replaces the ``_entry`` ``supervisor/cli/dev.py`` imported
with ``tests/controls_daemon.py``'s command for that protection, then runs the CLI's own ``main``. So only the
daemons of that one dev run with the check off; no switch of the product names it (docs/design.md "Testing",
"Protection-off twins").
"""

from __future__ import annotations

import sys

from tests import controls_daemon


def argv(protection: str) -> list[str]:
    """``openshell-sandbox`` (before ``dev`` and its arguments) whose dev starts its daemons with ``protection``
    off."""
    assert protection in controls_daemon.PATCHES, protection
    root = str(controls_daemon.ROOT)
    boot = f"import sys; sys.path.insert(0, {root!r}); from tests.controls_dev import main; main()"
    return [sys.executable, "-c", boot, protection]


def main() -> None:
    protection, args = sys.argv[1], sys.argv[2:]
    daemon = controls_daemon.argv(protection)
    from supervisor.cli import dev

    # dev.py's own name for it: the dev-mode command builders read it at call time
    dev._entry = lambda: list(daemon)
    from supervisor.cli.main import main as cli_main

    sys.argv = ["openshell-sandbox", *args]
    sys.exit(cli_main(args))
