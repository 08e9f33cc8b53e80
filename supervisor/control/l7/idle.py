"""One idle rule for every inspected path: a connection is idle only when no byte moved in either direction
for the idle timeout (the rule ``supervisor.link.relay`` keeps for raw relays).

An :class:`IdleClock` belongs to one connection. Every wait on it (a receive, a send, on either side) runs in
:meth:`IdleClock.guard`, a cancel scope whose deadline is the clock's; :meth:`IdleClock.touch` — called when
bytes arrive or leave on any side — moves the deadline of every wait in progress. So a WebSocket whose server
keeps talking while the client is silent, or an upload making steady progress while the answer has not
started, is never idle; a connection where nothing moves either way is, after exactly the timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

__all__ = ["IdleClock"]


class IdleClock:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.last = trio.current_time()
        self._waits: set[trio.CancelScope] = set()

    @property
    def deadline(self) -> float:
        return self.last + self.timeout

    def touch(self) -> None:
        """Bytes moved: every wait in progress gets the full timeout again."""
        self.last = trio.current_time()
        for scope in self._waits:
            scope.deadline = self.deadline

    @contextmanager
    def guard(self) -> Iterator[trio.CancelScope]:
        """A cancel scope ending at the clock's deadline, kept in step with :meth:`touch`; check
        ``cancelled_caught`` afterwards to tell idleness from completion."""
        scope = trio.CancelScope(deadline=self.deadline)
        self._waits.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._waits.discard(scope)
