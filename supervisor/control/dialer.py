"""How control redials the boundary: capped exponential backoff, reset only by a successful attach or resume.

Control always dials; the boundary only listens. A dial can fail before the handshake (nothing listening), in it
(a TLS alert: wrong CA, a certificate outside its validity), right after it (the peer's claim check refuses us
with a GOAWAY naming the field, ``link.refusal.send_refusal``) or at any lifecycle step after that. Every one of
those is one failure: logged once (``link.failed``, with the peer, the step and the reason) and followed by
one backoff step.

Why only attach/resume resets the backoff: a link that completes its handshake and is then refused, or that
a peer hangs up on, is no progress. Resetting on "handshake done" redialled a refusing boundary every ~60 ms
forever; here it climbs to the cap (30 s) and stays there until the lifecycle actually moves. Waiting for the
workload that is gone (the agent exited, the boundary unreachable) therefore costs one dial per 30 s, never a
crash loop. A reset also wakes a link that is sleeping out a long step (the egress links after a new attach).
"""

from __future__ import annotations

import trio

__all__ = ["BACKOFF_CAP_S", "BACKOFF_START_S", "Backoff", "BackoffGroup"]

BACKOFF_START_S = 0.05
BACKOFF_CAP_S = 30.0


class Backoff:
    """One link's redial delay: ``start``, doubling per failure, at most ``cap``."""

    def __init__(self, start: float = BACKOFF_START_S, cap: float = BACKOFF_CAP_S) -> None:
        if not 0 < start <= cap:
            raise ValueError("backoff needs 0 < start <= cap")
        self.start = start
        self.cap = cap
        self._delay = start
        self._reset = trio.Event()

    @property
    def delay(self) -> float:
        """The wait the next failure will cost."""
        return self._delay

    def advance(self) -> float:
        """A failure: return the delay to wait now and double the next one (up to the cap)."""
        delay = self._delay
        self._delay = min(self._delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        """Progress was made: start again from ``start``, and cut short a wait in progress."""
        self._delay = self.start
        self._reset.set()
        self._reset = trio.Event()

    async def sleep(self, delay: float) -> None:
        """Wait ``delay`` seconds, or until :meth:`reset`."""
        event = self._reset
        with trio.move_on_after(delay):
            await event.wait()


class BackoffGroup:
    """The backoffs of all of control's links, reset together by a successful attach or resume."""

    def __init__(self, start: float = BACKOFF_START_S, cap: float = BACKOFF_CAP_S) -> None:
        self.start = start
        self.cap = cap
        self._members: list[Backoff] = []

    def new(self) -> Backoff:
        backoff = Backoff(self.start, self.cap)
        self._members.append(backoff)
        return backoff

    def reset(self) -> None:
        for backoff in self._members:
            backoff.reset()
