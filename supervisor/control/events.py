"""Control's recent events, kept in memory for ``GET /v1/events`` (docs/design.md "Events").

Every line control logs is also recorded here, numbered, in a ring of the last ``capacity`` events, so that
``openshell-sandbox logs`` can show the last N events of any control — dev mode's or a pod's — and then
follow the new ones as they come, without access to control's stdout.

Rules:

1. Recording never blocks and never fails: ``JsonLog`` calls :meth:`EventBuffer.record` for every line, from
   trio tasks and possibly from worker threads; the ring is guarded by a lock, and followers are woken in
   trio's thread (``run_sync_soon`` from any other thread).
2. Sequence numbers only grow; a follower that fell more than ``capacity`` events behind skips what was
   dropped (it is a view of recent activity, the durable log is control's stdout).
3. A kind filter matches an event's name or its dotted family: ``egress`` matches ``egress`` and
   ``egress.refused``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import trio

from supervisor.protocol.event_record import Event

DEFAULT_CAPACITY = 2000


def matches(event: Event, kinds: Sequence[str]) -> bool:
    """Whether ``event`` is of one of ``kinds`` (all events when ``kinds`` is empty)."""
    if not kinds:
        return True
    name = str(event.name)
    return any(name == kind or name.startswith(kind + ".") for kind in kinds)


class EventBuffer:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._lock = threading.Lock()
        self._ring: deque[tuple[int, Event]] = deque(maxlen=capacity)
        self._seq = 0
        self._changed = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None

    def bind(self) -> None:
        """Call once inside the trio run that serves followers."""
        self._token = trio.lowlevel.current_trio_token()

    @property
    def last_seq(self) -> int:
        return self._seq

    def record(self, event: Event) -> None:
        with self._lock:
            self._seq += 1
            self._ring.append((self._seq, event))
        token = self._token
        if token is None:
            return
        try:
            in_trio = trio.lowlevel.current_trio_token() is token
        except RuntimeError:
            in_trio = False
        if in_trio:
            self._wake()
        else:
            try:
                token.run_sync_soon(self._wake)
            except trio.RunFinishedError:
                pass

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def tail(self, count: int, kinds: Sequence[str] = ()) -> tuple[list[Event], int]:
        """The last ``count`` matching events, oldest first, and the sequence number they reach."""
        with self._lock:
            chosen = [event for _, event in self._ring if matches(event, kinds)]
            return (chosen[-count:] if count > 0 else []), self._seq

    def after(self, seq: int, kinds: Sequence[str] = ()) -> tuple[list[Event], int]:
        """Matching events numbered above ``seq``, oldest first, and the sequence number they reach."""
        with self._lock:
            return [event for n, event in self._ring if n > seq and matches(event, kinds)], self._seq

    async def wait_after(self, seq: int) -> None:
        """Return once an event numbered above ``seq`` exists."""
        while self._seq <= seq:
            await self._changed.wait()
