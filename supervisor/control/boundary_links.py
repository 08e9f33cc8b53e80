"""Control's links to the boundary: control always dials and the boundary only listens. Each link is redialled
with capped exponential backoff whenever it drops (control/dialer.py), and each failure is logged once, with
the step it reached (docs/quickstart.md "When the link fails").

The egress links carry the captured connections (control serves HTTP/2 on them); the ops link is driven by
control/lifecycle_driver.py.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

import trio

from supervisor.control.config import ControlConfig
from supervisor.control.dialer import Backoff, BackoffGroup
from supervisor.control.egress import EgressService
from supervisor.control.peer import BoundaryPeer
from supervisor.link.h2link import Link
from supervisor.link.socket_tls import SocketTLSStream
from supervisor.link.tls_link import Refused, dial_link
from supervisor.protocol.agent_ended import why_ended
from supervisor.protocol.certs import BundleError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.tls import ALPN_EGRESS, client_context

AGENT_END_REDIAL_S = 1.0  # the first redial after the agent ended and the boundary closed its links


@dataclass
class LinkFailure:
    """Why one link attempt ended: the step it reached, the field a refusal named (never a value), the reason."""

    step: str = "dial"
    field: str | None = None
    reason: str = "link ended"

    def describe(self) -> str:
        where = f" field={self.field}" if self.field else ""
        return f"{self.step}:{where} {self.reason}"


def describe_exception(exc: BaseException) -> str:
    """An unexpected exception for a log line: the one inside a nursery's group, type and message."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


class BoundaryLinks:
    """Dialling the boundary, logging each failed attempt once, and the egress links' redial loops."""

    def __init__(self, cfg: ControlConfig, peer: BoundaryPeer, egress: EgressService) -> None:
        self.cfg = cfg
        self.log = cfg.log
        self.peer = peer
        self.egress = egress
        self.backoffs = BackoffGroup()  # every link's, reset together by a successful attach or resume
        self.nursery: trio.Nursery | None = None  # the daemon's, where the egress links run
        self._egress_started = False
        self.on_start: list[Callable[[], None]] = []  # told at every attach or resume (control's workers)

    @property
    def peer_name(self) -> str:
        return f"{self.cfg.boundary_host}:{self.cfg.boundary_port}"

    def link_failed(self, alpn: str, backoff: Backoff, failure: LinkFailure, **extra: JsonValue) -> float:
        """The one log line of one failed link (docs/quickstart.md "When the link fails"); returns the delay to wait.

        Once the agent's result is in, the boundary closing its links is how a sandbox ends, not a failure: one
        ``link.closed`` line says so for all of them, and the first redial waits ``AGENT_END_REDIAL_S`` (dev mode
        stops control meanwhile; a pod's control redials a boundary that may come back, failures logged again).
        """
        if self.said_agent_ended(failure):
            return AGENT_END_REDIAL_S
        delay = backoff.advance()
        self.say_failed(alpn, failure, delay, **extra)
        return delay

    def said_agent_ended(self, failure: LinkFailure) -> bool:
        """Whether ``failure`` is the boundary closing its links after the agent's end (said once, for all)."""
        peer = self.peer
        if peer.agent_result is None or failure.step not in ("agent-exited", "serving"):
            return False
        if not peer.closed_said:
            peer.closed_said = True
            self.log.emit(EventName.LINK_CLOSED, peer=self.peer_name, reason=f"{why_ended(peer.agent_result)}; "
                          "the boundary closed its links")  # fmt: skip
        return True

    def say_failed(self, alpn: str, failure: LinkFailure, delay: float, **extra: JsonValue) -> None:
        self.log.emit(
            EventName.LINK_FAILED, peer=self.peer_name, alpn=alpn, step=failure.step, field=failure.field,
            reason=failure.reason, retry_in_s=round(delay, 3), **extra,
        )  # fmt: skip

    async def dial(self, alpn: str, failure: LinkFailure) -> SocketTLSStream | None:
        """One dial; a refusal (connect, handshake, claims: ours of the boundary's) is recorded in ``failure``."""
        failure.step = "dial"
        try:
            ctx = client_context(self.cfg.bundle, (alpn,))
            tls, _claims = await dial_link(self.cfg.boundary_host, self.cfg.boundary_port, ctx, self.cfg.bundle, alpn)
        except Refused as exc:
            failure.step = "connect" if exc.field is None else "handshake"
            failure.field, failure.reason = exc.field, exc.reason
            return None
        except (BundleError, ssl.SSLError, OSError) as exc:  # our own bundle became unreadable
            failure.field, failure.reason = "bootstrap", str(exc)
            return None
        return tls

    def start_egress_links(self) -> None:
        for started in self.on_start:
            started()
        if self._egress_started or self.nursery is None:
            return
        self._egress_started = True
        for index in range(self.cfg.egress_links):
            self.nursery.start_soon(self._maintain_egress_link, index)

    async def _maintain_egress_link(self, index: int) -> None:
        """One egress link, redialled with backoff: we dial (TLS client) and serve HTTP/2 on it."""
        backoff = self.backoffs.new()
        while True:
            failure = LinkFailure()
            try:
                tls = await self.dial(ALPN_EGRESS, failure)
                if tls is not None:
                    failure.step = "serving"
                    name = f"egress{index}:{self.peer_name}"
                    link = Link(tls, client=False, handler=self.egress.handle, name=name)
                    self.peer.egress_link_up()
                    self.log.emit(EventName.LINK_UP, peer=self.peer_name, alpn=ALPN_EGRESS, index=index)
                    try:
                        await link.run()
                    finally:
                        self.peer.egress_up -= 1
                    failure.reason, failure.field = link.close_reason or "link ended", link.refused_field
            except Exception as exc:  # never the daemon's end (see LifecycleDriver.maintain_ops_link)
                failure.reason = describe_exception(exc)
            await backoff.sleep(self.link_failed(ALPN_EGRESS, backoff, failure, index=index))
