"""The fence, watched after ``confirm`` (issue 15 item 3; docs/spec/boundary.md §1.2, capture/setup.py rule 2).

Rules:

1. ``confirm`` fingerprinted the agent's network namespace (links, addresses, routes in every table, rules, the
   nftables ruleset: ``setup.inspect``). From then on a re-read is triggered by any rtnetlink notification of
   that namespace (links, addresses, routes, rules; a socket the launcher created there) and by a timer every
   ``interval_s`` whatever happens (nftables changes are not on rtnetlink).
2. Only a changed fingerprint counts: a notification that changed nothing (a neighbour, a cache entry) is a
   re-read and nothing more. A re-read that fails is logged and retried at the next trigger.
3. A changed fingerprint is reported once (``on_lost``) and the watch ends: the caller kills every workload
   process; there is no "changed back".
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

__all__ = ["RTNL_GROUPS", "FenceWatch", "rtnetlink_groups_socket"]

WATCH_INTERVAL_S: Final = 5.0
DEBOUNCE_S: Final = 0.05  # one re-read for a burst of notifications (a veth pair is several)
# RTMGRP_LINK | IPV4_IFADDR | IPV4_ROUTE | IPV4_RULE | IPV6_IFADDR | IPV6_ROUTE | IPV6_RULE (rtnetlink.h)
RTNL_GROUPS: Final = 0x1 | 0x10 | 0x40 | 0x80 | 0x100 | 0x400 | (1 << 18)


def rtnetlink_groups_socket(sock: socket.socket) -> socket.socket:
    """Subscribe ``sock`` (AF_NETLINK, NETLINK_ROUTE, made in the agent's namespace) to the fence's groups."""
    sock.bind((0, RTNL_GROUPS))
    sock.setblocking(False)
    return sock


class FenceWatch:
    def __init__(
        self,
        *,
        expected: str,
        inspect: Callable[[], Awaitable[dict[str, Any]]],
        on_lost: Callable[[dict[str, Any]], Awaitable[None]],
        on_error: Callable[[str], None],
        notifications: socket.socket | None = None,
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.expected = expected
        self._inspect = inspect
        self._on_lost = on_lost
        self._on_error = on_error
        self._sock = notifications
        self.interval_s = interval_s
        self.reads = 0  # re-reads done (tests, status)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            task_status.started()
            while True:
                await self._trigger()
                report = await self._read()
                if report is not None and report.get("fingerprint") != self.expected:
                    await self._on_lost(report)
                    return
        finally:
            if self._sock is not None:
                self._sock.close()

    async def _trigger(self) -> None:
        with trio.move_on_after(self.interval_s):
            if self._sock is None:
                await trio.sleep_forever()
            await trio.lowlevel.wait_readable(self._sock)
            await trio.sleep(DEBOUNCE_S)
        if self._sock is not None:
            with contextlib.suppress(OSError):  # EAGAIN when drained; ENOBUFS after an overrun
                while self._sock.recv(65536):  # drain: the re-read looks at everything anyway
                    pass

    async def _read(self) -> dict[str, Any] | None:
        self.reads += 1
        try:
            return await self._inspect()
        except Exception as exc:  # the launcher is busy or gone: the next trigger tries again
            self._on_error(f"{type(exc).__name__}: {exc}")
            return None
