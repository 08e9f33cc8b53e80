"""Control's half of model P's canary (protocol/fence_canary.py): a listener that should never be reached from
the workload's pod, and the round that asks the boundary to try.

Rules:

1. The listener is bound at control's start on ``--fence-canary ADDR:PORT`` exactly (a literal IP); that same
   address is what the attach descriptor tells the boundary. Every connection is accepted and closed at once;
   nothing is read from it.
2. The self-check: control connects to its own canary from its own side and waits until the listener accepted
   that very connection (matched by its source address and port). Only then does "nothing seen" mean anything.
3. One round: self-check, note what was seen so far, ask the boundary to probe (``/v1/fence-probe``), give a
   late SYN a moment (``LATE_S``), and report every connection that arrived in between and was not a
   self-check. Outside a round nothing counts (another pod may scan the port; only a probe's window is ours).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Final

import trio

from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link
from supervisor.link.rpc import call_typed
from supervisor.protocol.acks import NoArguments
from supervisor.protocol.event_names import EventName
from supervisor.protocol.fence_canary import PROBE_TIMEOUT_S, SELF_CHECK_OK, CanaryReport, ProbeResult, format_canary
from supervisor.protocol.json_value import JsonValue

__all__ = ["FenceCanary"]

LATE_S: Final = 0.3  # after the probe's reply: a connection still in flight is counted
MAX_PEERS: Final = 8


@dataclass
class FenceCanary:
    address: str
    port: int
    log: JsonLog
    seen: list[tuple[float, str]] = field(default_factory=list)  # (trio time, peer) of non-self connections
    rounds: int = 0
    last: dict[str, JsonValue] | None = None
    _self_pending: dict[int, trio.Event] = field(default_factory=dict)  # source port of a self-check

    @property
    def target(self) -> str:
        return format_canary(self.address, self.port)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            await sock.bind((self.address, self.port))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"--fence-canary {self.target}: cannot listen: {exc.strerror}") from None
        self.log.emit(EventName.FENCE_CANARY_LISTENING, address=self.target)
        task_status.started()
        with sock:
            while True:
                conn, peer = await sock.accept()
                conn.close()
                event = self._self_pending.pop(int(peer[1]), None)
                if event is not None:
                    event.set()
                    continue
                text = format_canary(str(peer[0]), int(peer[1]))
                self.seen.append((trio.current_time(), text))
                self.log.emit(EventName.FENCE_CANARY_CONNECTION, peer=text, level="warning")

    async def self_check(self) -> str:
        """Reach our own canary from our side; ``SELF_CHECK_OK`` or why not. The connection is recognised by
        its source port, registered before the connect (a stranger that happened to use the same port would
        make our own connection count as seen: the round fails, never the other way round)."""
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        port = 0
        try:
            with trio.move_on_after(PROBE_TIMEOUT_S):
                await sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
                port = int(sock.getsockname()[1])
                arrived = self._self_pending[port] = trio.Event()
                try:
                    await sock.connect((self.address, self.port))
                except OSError as exc:
                    return f"connect to {self.target} from control: {exc.strerror}"
                await arrived.wait()
                return SELF_CHECK_OK
            return f"control's own connection to {self.target} was not accepted within {PROBE_TIMEOUT_S:g}s"
        finally:
            self._self_pending.pop(port, None)
            sock.close()

    async def round(self, link: Link) -> CanaryReport:
        """Self-check, ask the boundary to probe, report what arrived meanwhile (rule 3). An ``OpError`` from the
        probe (the boundary connected: it ends itself or the workload) propagates."""
        self.rounds += 1
        check = await self.self_check()
        mark = len(self.seen)
        reply = await call_typed(link, "/v1/fence-probe", NoArguments(), ProbeResult)
        await trio.sleep(LATE_S)
        peers = [peer for _, peer in self.seen[mark:]]
        report = CanaryReport(probe=reply.probe, seen=len(peers), self_check=check,
                              peers=tuple(peers[:MAX_PEERS]))  # fmt: skip
        self.last = {**report.to_wire(), "probe_error": reply.error, "observed": report.observed}
        self.log.emit(EventName.FENCE_CANARY_ROUND, **self.last)
        return report

    def status(self) -> dict[str, JsonValue]:
        return {"address": self.target, "rounds": self.rounds, "last": self.last, "seen_total": len(self.seen)}
