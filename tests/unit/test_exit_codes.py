"""Exit codes are defined once, in supervisor/protocol/exit_codes.py (docs/design.md "Settled details")."""

from __future__ import annotations

import ast
import errno
import signal
from pathlib import Path

import pytest

from supervisor.protocol.exit_codes import ExitCode, for_launch_errno, for_signal
from tests.tracked import tracked

ROOT = Path(__file__).resolve().parents[2] / "supervisor"
CATALOGUE = ROOT / "protocol" / "exit_codes.py"
# Numbers equal to an exit code that are not one.
NOT_EXIT_CODES = {
    Path("supervisor/control/l7/websocket.py"): "RFC 6455 §5.5: a control frame's payload is at most 125 bytes",
}


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (errno.ENOENT, 127),
        (errno.EACCES, 126),
        (errno.ENOEXEC, 126),
        (errno.EISDIR, 126),
        (errno.EPERM, 126),
        (errno.ENOMEM, 125),
        (errno.E2BIG, 125),
        (None, 125),
    ],
)
def test_launch_errno_names_the_program_or_ourselves(err: int | None, code: int) -> None:
    assert for_launch_errno(err) == code


def test_signal_codes_are_128_plus_n() -> None:
    assert for_signal(signal.SIGKILL) == 137
    assert for_signal(signal.SIGTERM) == 143


def test_the_values_the_design_promises() -> None:
    assert (ExitCode.USAGE, ExitCode.TIMEOUT, ExitCode.SELF_FAILED) == (2, 124, 125)
    assert (ExitCode.NOT_EXECUTABLE, ExitCode.NOT_FOUND) == (126, 127)


def _literal_exit_codes(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        # ``128 + n`` spelled by hand, and the self-failure code as a bare number.
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if any(isinstance(side, ast.Constant) and side.value == 128 for side in (node.left, node.right)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Constant) and type(node.value) is int and node.value == ExitCode.SELF_FAILED:
            found.append((node.lineno, repr(node.value)))
    return found


def test_no_module_spells_an_exit_code_of_its_own() -> None:
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{line}: {text}"
        for path in tracked("supervisor")
        if path != CATALOGUE and path.relative_to(ROOT.parent) not in NOT_EXIT_CODES
        for line, text in _literal_exit_codes(ast.parse(path.read_text(), str(path)))
    ]
    assert offenders == [], "use supervisor.protocol.exit_codes:\n" + "\n".join(offenders)
