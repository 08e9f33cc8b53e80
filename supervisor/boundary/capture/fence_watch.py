"""The fence, watched after ``confirm`` (docs/reference/boundary.md §1.2, capture/setup.py rule 2).

Rules:

1. ``confirm`` fingerprinted the agent's network namespace (links, addresses, routes in every table, rules, the
   nftables ruleset: ``setup.inspect``). From then on a re-read is triggered by any rtnetlink notification of
   that namespace (links, addresses, routes, rules; a socket the launcher created there), by any nftables
   notification of it (nfnetlink's NFNLGRP_NFTABLES group: tables, chains, rules, sets) and by a timer every
   ``interval_s`` whatever happens (the backstop, e.g. where a notification socket could not be made).
2. Only a changed fingerprint counts: a notification that changed nothing (a neighbour, a cache entry) is a
   re-read and nothing more. A re-read that fails is logged and retried at the next trigger.
3. A changed fingerprint is reported once (``on_lost``) and the watch ends: the caller kills every workload
   process; there is no "changed back".
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import trio

from supervisor.boundary.capture.readback import FenceReadback

__all__ = ["NFTABLES_GROUPS", "RTNL_GROUPS", "FenceWatch", "nftables_groups_socket", "rtnetlink_groups_socket"]

WATCH_INTERVAL_S: Final = 5.0
DEBOUNCE_S: Final = 0.05  # one re-read for a burst of notifications (a veth pair is several)
# RTMGRP_LINK | IPV4_IFADDR | IPV4_ROUTE | IPV4_RULE | IPV6_IFADDR | IPV6_ROUTE | IPV6_RULE (rtnetlink.h)
RTNL_GROUPS: Final = 0x1 | 0x10 | 0x40 | 0x80 | 0x100 | 0x400 | (1 << 18)
NETLINK_NETFILTER: Final = 12  # linux/netlink.h
NFNLGRP_NFTABLES: Final = 7  # linux/netfilter/nfnetlink.h
NFTABLES_GROUPS: Final = 1 << (NFNLGRP_NFTABLES - 1)


def rtnetlink_groups_socket(sock: socket.socket) -> socket.socket:
    """Subscribe ``sock`` (AF_NETLINK, NETLINK_ROUTE, made in the agent's namespace) to the fence's groups."""
    sock.bind((0, RTNL_GROUPS))
    sock.setblocking(False)
    return sock


def nftables_groups_socket(sock: socket.socket) -> socket.socket:
    """Subscribe ``sock`` (AF_NETLINK, NETLINK_NETFILTER, made in the agent's namespace) to nftables changes.
    The kernel checks CAP_NET_ADMIN over that namespace against the socket's creator (the launcher)."""
    sock.bind((0, NFTABLES_GROUPS))
    sock.setblocking(False)
    return sock


class FenceWatch:
    def __init__(
        self,
        *,
        expected: str,
        inspect: Callable[[], Awaitable[FenceReadback]],
        on_lost: Callable[[FenceReadback], Awaitable[None]],
        on_error: Callable[[str], None],
        notifications: socket.socket | Sequence[socket.socket] | None = None,
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.expected = expected
        self._inspect = inspect
        self._on_lost = on_lost
        self._on_error = on_error
        if notifications is None:
            notifications = ()
        self._socks = (notifications,) if isinstance(notifications, socket.socket) else tuple(notifications)
        self.interval_s = interval_s
        self.reads = 0  # re-reads done (tests, status)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            task_status.started()
            while True:
                trigger = await self._trigger()
                report = await self._read()
                if report is not None and report.fingerprint != self.expected:
                    await self._on_lost(report.triggered_by(trigger))
                    return
        finally:
            for sock in self._socks:
                sock.close()

    async def _trigger(self) -> str:
        """Wait for a notification on any socket (then a short debounce) or the timer; says which."""
        woke: list[socket.socket] = []
        with trio.move_on_after(self.interval_s):
            if not self._socks:
                await trio.sleep_forever()
            async with trio.open_nursery() as nursery:
                for sock in self._socks:
                    nursery.start_soon(_readable, sock, woke, nursery.cancel_scope)
            await trio.sleep(DEBOUNCE_S)
        for sock in self._socks:
            with contextlib.suppress(OSError):  # EAGAIN when drained; ENOBUFS after an overrun
                while sock.recv(65536):  # drain: the re-read looks at everything anyway
                    pass
        return "notification" if woke else "timer"

    async def _read(self) -> FenceReadback | None:
        self.reads += 1
        try:
            return await self._inspect()
        except Exception as exc:  # the launcher is busy or gone: the next trigger tries again
            self._on_error(f"{type(exc).__name__}: {exc}")
            return None


async def _readable(sock: socket.socket, woke: list[socket.socket], done: trio.CancelScope) -> None:
    await trio.lowlevel.wait_readable(sock)
    woke.append(sock)
    done.cancel()
