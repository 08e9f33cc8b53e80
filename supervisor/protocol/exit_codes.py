"""Exit codes, defined once (docs/design.md "Settled details": "Streams are for payload").

Every process of ours that ends with a code — both daemons, dev mode, every CLI client — reports:

* the remote (or agent's) own code when it exited;
* ``128 + N`` when signal N ended it (``for_signal``), as a shell reports it;
* ``124`` when a timeout we were asked to enforce ended it, as ``timeout(1)`` reports it;
* ``126`` / ``127`` when its launch failed because the program is not executable / not found
  (``for_launch_errno`` maps the ``execve`` errno);
* ``125`` when openshell-sandbox itself failed;
* ``2`` for a usage error (a flag, argument or input file the user must fix).

Commands with answers of their own (``policy decide``: 0 allow, 1 deny) keep those beside these.
"""

from __future__ import annotations

import enum
import errno as _errno

__all__ = ["ExitCode", "for_launch_errno", "for_signal"]


class ExitCode(enum.IntEnum):
    OK = 0
    USAGE = 2
    TIMEOUT = 124
    SELF_FAILED = 125
    NOT_EXECUTABLE = 126
    NOT_FOUND = 127


SIGNAL_BASE = 128

# execve(2) errnos that mean "this program cannot be run" rather than "we failed".
_NOT_EXECUTABLE_ERRNOS = frozenset({_errno.EACCES, _errno.ENOEXEC, _errno.EISDIR, _errno.EPERM})


def for_signal(number: int) -> int:
    """The code for a process ended by signal ``number``."""
    return SIGNAL_BASE + number


def for_launch_errno(errno: int | None) -> ExitCode:
    """The code for a launch whose ``execve`` failed with ``errno`` (125 when it is no program's fault)."""
    if errno == _errno.ENOENT:
        return ExitCode.NOT_FOUND
    if errno in _NOT_EXECUTABLE_ERRNOS:
        return ExitCode.NOT_EXECUTABLE
    return ExitCode.SELF_FAILED
