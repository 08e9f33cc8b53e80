"""What every phase of one inspected connection shares: its state, its I/O with deadlines, its events.

The phases (``opening``, ``request``, ``upstream``, ``response``, ``upgrade``) are functions of a
:class:`Session`; the failures they raise end the connection in ``entry``.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

import h11
import trio

from supervisor.control.credentials import Credentials
from supervisor.control.l7.ca import InterceptionCA
from supervisor.control.l7.idle import IdleClock
from supervisor.control.l7.record import CloseReason, InspectStats, RequestRecord
from supervisor.control.l7.websocket import ClientFrameFilter, MessageFilter
from supervisor.control.policy import Decision, PolicySnapshot
from supervisor.control.policy.hosts import normalize_request_host
from supervisor.jsonlog import JsonLog
from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue

STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_RESERVED_EVENT_KEYS = frozenset({"event", "time", "component"})


@dataclass(frozen=True)
class Limits:
    idle_timeout: float = 300.0  # no progress either way: keep-alive idle, a slow upstream, a stalled reader
    head_timeout: float = 30.0  # from a head's first byte to its end (slowloris)
    handshake_timeout: float = 10.0  # each TLS handshake
    drain_timeout: float = 0.5  # reading what the agent still sends after a refusal, so it sees the answer
    # one read; at most one chunk per direction is held here. The raw relay's size (supervisor/link/relay.py): the
    # per-chunk Python (h11 events, TLS calls, scheduling) is paid a quarter as often as with 64 KiB
    chunk: int = 256 * 1024
    max_upstream_head: int = 64 * 1024


class AgentFailed(Exception):
    """The agent side failed or stalled: the connection ends without an answer."""


class UpstreamFailed(Exception):
    """The upstream side failed; ``timed_out`` when nothing moved for the idle timeout (answered 504, not 502)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ResponseRefused(UpstreamFailed):
    """The upstream's response cannot reach the agent without handing it a secret (``scrub``): answered 502 with
    ``reason`` in the event, never retried (the upstream did answer)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Done(Exception):
    """The request ended the connection (already logged)."""


class Session:
    """One inspected connection: both streams, the buffer of what was read ahead, the idle clock, the policy
    generation and decision it runs under, the websocket filters of an upgrade and the totals of its requests."""

    def __init__(
        self,
        agent: trio.abc.HalfCloseableStream,
        *,
        host: str,
        port: int,
        snapshot: PolicySnapshot,
        l4: Decision,
        connect_upstream: Callable[[], Awaitable[trio.abc.HalfCloseableStream]],
        ca: InterceptionCA,
        credentials: Credentials,
        upstream_ssl: ssl.SSLContext,
        log: JsonLog,
        event_fields: Mapping[str, JsonValue],
        is_current: Callable[[int], bool] | None,
        limits: Limits,
        raw_fallback: bool = False,
        early_upstream: trio.abc.HalfCloseableStream | None = None,
        current: Callable[[str, int], tuple[PolicySnapshot, Decision]] | None = None,
        choose_name: Callable[[str], Decision | None] | None = None,
    ) -> None:
        self.raw = agent
        self.agent: trio.abc.Stream = agent
        self.name = normalize_request_host(host) or host.lower()
        self.port = port
        self.snapshot = snapshot
        self.l4 = l4
        self.connect_upstream = connect_upstream
        self.ca = ca
        self.creds = credentials
        self.upstream_ssl = upstream_ssl
        self.log = log
        self.fields = {k: v for k, v in event_fields.items() if k not in _RESERVED_EVENT_KEYS}
        self.is_current = is_current
        self.limits = limits
        self.tls = False
        self.buffer = bytearray()
        self.upstream: trio.abc.Stream | None = None
        self.up: h11.Connection | None = None
        self.stats = InspectStats()
        self.clean = True
        self.failure: AgentFailed | UpstreamFailed | None = None
        self.scope = trio.CancelScope()
        self.ws_filter: ClientFrameFilter | MessageFilter | None = None
        self.ws_text_decision: Decision | None = None
        self.raw_fallback = raw_fallback
        self.early_upstream = early_upstream
        self.origin_first: bytes | None = None
        self.current = current
        self.choose_name = choose_name
        self.handed_off = False
        self.idle = IdleClock(limits.idle_timeout)

    def end(self, why: CloseReason, error: str | None = None, *, clean: bool = True) -> None:
        if not self.stats.closed_by:
            self.stats.closed_by = str(why)
            self.stats.error = error
        self.clean = self.clean and clean

    def stale(self) -> bool:
        return self.is_current is not None and not self.is_current(self.snapshot.generation)

    # --- I/O with deadlines ------------------------------------------------------------------------------------
    async def agent_recv(self, seconds: float | None) -> bytes | None:
        """Bytes, ``b""`` at EOF, ``None`` when ``seconds`` passed first (``None``: the idle rule, no byte
        moved either way for the idle timeout)."""
        data: bytes | None = None
        with self.idle.guard() if seconds is None else trio.move_on_after(max(seconds, 0)):
            try:
                data = bytes(await self.agent.receive_some(self.limits.chunk))
            except STREAM_ERRORS as exc:
                raise AgentFailed(f"agent: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        if data:
            self.idle.touch()
        return data

    async def agent_send(self, data: bytes) -> None:
        if not data:
            return
        with self.idle.guard() as scope:
            try:
                await self.agent.send_all(data)
            except STREAM_ERRORS as exc:
                raise AgentFailed(f"agent: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        if scope.cancelled_caught:
            raise AgentFailed("agent: not reading (idle timeout)")
        self.idle.touch()

    async def send_quietly(self, data: bytes) -> None:
        try:
            await self.agent_send(data)
        except AgentFailed:
            self.clean = False

    async def up_recv(self) -> bytes:
        assert self.upstream is not None
        with self.idle.guard():
            try:
                data = bytes(await self.upstream.receive_some(self.limits.chunk))
            except STREAM_ERRORS as exc:  # a receive holds no request bytes: the cause (a reset) may be named
                cause = exc.__cause__ or exc
                raise UpstreamFailed(f"upstream: {type(cause).__name__}: {cause}"[:200].rstrip(": ")) from None
            self.idle.touch()
            return data
        raise UpstreamFailed("upstream: idle timeout", timed_out=True)

    async def up_send(self, data: bytes | None) -> None:
        assert self.upstream is not None
        if not data:
            return
        with self.idle.guard() as scope:
            try:
                await self.upstream.send_all(data)
            except STREAM_ERRORS as exc:
                # the bytes may hold a secret: report the exception type only, never its text
                raise UpstreamFailed(f"upstream: {type(exc).__name__}") from None
        if scope.cancelled_caught:
            raise UpstreamFailed("upstream: not reading (idle timeout)", timed_out=True)
        self.idle.touch()

    # --- events ------------------------------------------------------------------------------------------------
    def tunnel_event(self, what: str, **fields: JsonValue) -> None:
        self.log.emit(EventName.HTTP_TUNNEL, **{**self.fields, "destination": f"{self.name}:{self.port}", "stage": what,
                                                **fields})  # fmt: skip

    def request_event(self, rec: RequestRecord) -> None:
        self.stats.count(rec)
        self.log.emit(EventName.HTTP, **{**self.fields, "destination": f"{self.name}:{self.port}", "tls": self.tls,
                                         "policy_generation": self.snapshot.generation,
                                         **rec.event_fields(trio.current_time())})  # fmt: skip

    def malformed(self, rec: RequestRecord, reason: str, detail: str) -> NoReturn:
        """A request refused before policy: logged, and the connection closed without an answer."""
        rec.reason = reason
        rec.detail = f"HTTP request rejected before policy evaluation: {detail}"
        self.request_event(rec)
        self.end(CloseReason.MALFORMED, reason, clean=False)
        raise Done
