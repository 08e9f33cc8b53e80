"""Ctrl-C for a command a test starts, as a terminal would deliver it.

A suite started as a background job of a non-interactive shell (``make test & make test``) inherits SIGINT
*ignored*, and so does every process it starts; a Python started that way never installs its
KeyboardInterrupt handler, so a test's ``send_signal(SIGINT)`` would do nothing. Start such a command with
``preexec_fn=interruptible`` when the test means to interrupt it.
"""

from __future__ import annotations

import signal

__all__ = ["interruptible"]


def interruptible() -> None:
    """In the child, before exec: SIGINT back to its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
