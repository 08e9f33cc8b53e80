"""One idle rule for every inspected path: a connection is idle only when no byte moved in either direction
for the idle timeout (the rule ``supervisor.link.relay`` keeps for raw relays).

An :class:`IdleClock` belongs to one connection. Every wait on it (a receive, a send, on either side) runs in
:meth:`IdleClock.guard`, a cancel scope whose deadline is the clock's; :meth:`IdleClock.touch` — called when
bytes arrive or leave on any side — moves the deadline of every wait in progress. So a WebSocket whose server
keeps talking while the client is silent, or an upload making steady progress while the answer has not
started, is never idle; a connection where nothing moves either way is, after exactly the timeout.
"""

from __future__ import annotations

from types import TracebackType

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

    def guard(self) -> _Guard:
        """A cancel scope ending at the clock's deadline, kept in step with :meth:`touch`; check
        ``cancelled_caught`` afterwards to tell idleness from completion."""
        return _Guard(self._waits, trio.CancelScope(deadline=self.deadline))


class _Guard:
    """``with`` it: the scope is entered and registered with its clock, and both undone on the way out (a class,
    not a ``contextmanager`` generator: four of these run per request on a kept-alive connection)."""

    __slots__ = ("_scope", "_waits")

    def __init__(self, waits: set[trio.CancelScope], scope: trio.CancelScope) -> None:
        self._waits = waits
        self._scope = scope

    def __enter__(self) -> trio.CancelScope:
        self._waits.add(self._scope)
        try:
            return self._scope.__enter__()
        except BaseException:
            self._waits.discard(self._scope)
            raise

    def __exit__(self, etype: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        self._waits.discard(self._scope)
        return self._scope.__exit__(etype, exc, tb)
