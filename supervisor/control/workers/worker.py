"""One worker process of control: it serves whole egress connections — its own egress links to the boundary, or
its share of the proxy listener — under a copy of the primary's policy, and asks the primary about what has one
owner (pins, issued names, DNS). Its events go to the primary, which logs them with ``worker`` set."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import functools
import signal
import socket
import sys
import traceback
from collections.abc import AsyncIterator, Callable

import trio

from supervisor.control.boundary_links import AGENT_END_REDIAL_S, BoundaryLinks, LinkFailure
from supervisor.control.config import ControlConfig
from supervisor.control.dialer import Backoff
from supervisor.control.egress import EgressService
from supervisor.control.inference.from_config import inference_router
from supervisor.control.l7.rewrite import redact_path
from supervisor.control.peer import BoundaryPeer
from supervisor.control.policy.compiled import CompiledPolicy
from supervisor.control.policy.errors import PolicyError, PolicyInvalid
from supervisor.control.policy.identity import BinaryIdentity
from supervisor.control.policy.store import PolicySnapshot, PolicyStatus
from supervisor.control.proxy_listener import ProxyListener
from supervisor.control.workers.channel import Channel, ChannelClosed
from supervisor.control.workers.pins import OwnedPins
from supervisor.control.workers.wire import Kind, Message
from supervisor.protocol.event_record import Event
from supervisor.protocol.json_value import JsonValue

ASK_TIMEOUT_S = 5.0  # a question to the primary not answered within this is answered strictly (see PrimaryState)
DNS_TIMEOUT_S = 15.0  # a DNS query's answer, which may wait on the upstream resolver
FLUSH_S = 1.0  # how long a worker told to end spends writing out its last events (the primary waits 2 s)
STATS_EVERY_S = 0.5  # how often a worker tells the primary its live connections and counters, when they changed
_PR_SET_PDEATHSIG = 1


class PrimaryState:
    """The worker's side of :class:`supervisor.control.egress.SharedState`: questions to the primary. When the
    primary cannot answer (gone, or no answer within ``ASK_TIMEOUT_S``), the answer is the strict one: no pin
    (refused), no issued name, SERVFAIL."""

    def __init__(self, channel: Channel, pins: OwnedPins) -> None:
        self.channel = channel
        self.pins = pins

    async def _ask(self, message: Message, within: float = ASK_TIMEOUT_S) -> Message | None:
        with trio.move_on_after(within):
            try:
                return await self.channel.request(message)
            except ChannelClosed:
                return None
        return None

    async def ensure_pin(self, identity: BinaryIdentity) -> None:
        if self.pins.knows(identity):
            return
        reply = await self._ask({"type": Kind.PIN, "path": identity.path, "sha256": identity.sha256})
        if reply is None:
            return
        pinned = reply.get("pinned")
        self.pins.learn(identity.path, pinned if isinstance(pinned, str) else None)

    async def issued_names(self, address: str) -> list[str]:
        reply = await self._ask({"type": Kind.ISSUED, "address": address})
        if reply is None:
            return []
        names = reply.get("names")
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    async def answer_dns(self, wire: bytes) -> bytes:
        servfail = wire[:2] + b"\x81\x02" + b"\x00" * 8 if len(wire) >= 2 else b""
        query: Message = {"type": Kind.DNS_QUERY, "wire": base64.b64encode(wire).decode()}
        reply = await self._ask(query, DNS_TIMEOUT_S)  # the primary may be resolving upstream meanwhile
        if reply is None:
            return servfail
        answer = reply.get("wire")
        return base64.b64decode(answer) if isinstance(answer, str) else servfail


class _WorkerPeer(BoundaryPeer):
    """The worker's egress links counted at the primary (its readiness and status count every process's)."""

    def __init__(self, tell: Callable[[Message], None]) -> None:
        self._tell = tell
        self._up = 0
        super().__init__()

    @property
    def egress_up(self) -> int:
        return self._up

    @egress_up.setter
    def egress_up(self, value: int) -> None:
        if hasattr(self, "_tell") and value != self._up:
            self._tell({"type": Kind.LINKS, "delta": value - self._up})
        self._up = value


class _WorkerLinks(BoundaryLinks):
    """A worker's egress links: a failed attempt is logged by the primary, which knows whether the agent ended."""

    tell: Callable[[Message], None]

    def link_failed(self, alpn: str, backoff: Backoff, failure: LinkFailure, **extra: JsonValue) -> float:
        delay = backoff.advance()
        if failure.step in ("agent-exited", "serving"):  # maybe the agent's end, which only the primary knows:
            delay = max(delay, AGENT_END_REDIAL_S)  # redial no sooner than the primary would then
        self.tell({"type": Kind.LINK_FAILED, "alpn": alpn, "step": failure.step, "field": failure.field,
                   "reason": failure.reason, "delay": delay, "extra": dict(extra)})  # fmt: skip
        return delay


class Worker:
    def __init__(self, cfg: ControlConfig, index: int, sock: socket.socket, proxy: list[socket.socket] | None) -> None:
        self.cfg = cfg
        self.index = index
        self.channel = Channel(sock)
        log = self.log = cfg.log
        # nothing written here: every event goes to the primary, which records and writes it (one stream, one file)
        log.to_stream, log.file, log.tap = False, None, None
        log.sink = self._forward
        log.fields = {"worker": index}
        if cfg.interception is not None:
            log.scrub = functools.partial(redact_path, cfg.interception.credentials)
        self.pins = OwnedPins()
        self.inference = inference_router(cfg)
        self.egress = EgressService(
            cfg.policy, cfg.upstream, log, interception=cfg.interception, relaxed=cfg.relaxed_identity,
            inference=self.inference, shared=PrimaryState(self.channel, self.pins), pins=self.pins,
        )  # fmt: skip
        self.proxy = ProxyListener(cfg.proxy, self.egress, log, sockets=proxy) if cfg.proxy is not None else None
        self.peer = _WorkerPeer(self.channel.notify)
        self.links = _WorkerLinks(cfg, self.peer, self.egress)
        self.links.tell = self.channel.notify
        self._compiled: dict[str, CompiledPolicy] = {}  # the last compiled documents, by digest

    def _forward(self, event: Event) -> None:
        self.channel.notify({"type": Kind.EVENT, "event": event.to_wire()})

    async def serve(self) -> int:
        """Serve until the primary goes away or asks this worker to end (SIGTERM); then write out the events of
        the connections that ended with it, so that the primary logs them before its own end."""
        self.channel.bind()  # before anything that logs from a thread (the local addresses' first read)
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as top:
                async with trio.open_nursery() as serving:
                    top.start_soon(self._channel, serving.cancel_scope)
                    top.start_soon(self._end_on_signal, signals, serving.cancel_scope)
                    self.links.nursery = serving
                    if self.cfg.local_net is not None:  # the SSRF guard's view of control's own addresses
                        await serving.start(self.cfg.local_net.watch)
                    if self.proxy is not None:
                        await serving.start(self.proxy.serve)
                    if self.inference is not None and self.cfg.inference_file is not None:
                        from supervisor.control.inference.store import watch_routes_file
                        from supervisor.control.policy.watch_safety import watch_guard

                        serving.start_soon(functools.partial(
                            watch_routes_file, self.inference.store, self.cfg.inference_file,
                            guard=watch_guard(self.cfg.inference_file, self.cfg.agent_writable),
                        ))  # fmt: skip
                    serving.start_soon(self._tell_stats)
                with trio.move_on_after(FLUSH_S):
                    await self.channel.flush()
                top.cancel_scope.cancel()
        return 0

    async def _channel(self, serving: trio.CancelScope) -> None:
        await self.channel.run(self._handle)  # returns when the primary goes away
        serving.cancel()

    async def _end_on_signal(self, signals: AsyncIterator[int], serving: trio.CancelScope) -> None:
        async for _ in signals:
            serving.cancel()
            return

    async def _handle(self, message: Message) -> Message | None:
        kind = message["type"]
        if kind == Kind.POLICY:
            return await self._mirror(message)
        if kind == Kind.START_EGRESS:
            self.links.backoffs.reset()
            self.links.start_egress_links()
        return None

    async def _mirror(self, message: Message) -> Message:
        """Put the primary's snapshot in force here: compiled (in a thread), then published to this process's
        store, which re-decides and cuts this process's live connections as the primary's did."""
        store = self.cfg.policy
        source = str(message.get("source", ""))
        raw_errors = message.get("errors")
        errors = tuple(_error(e) for e in raw_errors if isinstance(e, dict)) if isinstance(raw_errors, list) else ()
        status = _status(str(message.get("status")))
        generation = message.get("generation")
        assert isinstance(generation, int)
        try:
            active = await self._compile(message.get("policy"), source)
            last_valid = await self._compile(message.get("last_valid"), source) or store.snapshot().last_valid
        except PolicyInvalid as exc:  # cannot be (the primary compiled the same document): nothing allowed here
            why = PolicyError("", f"control worker {self.index} could not compile the policy: {exc}", None, None,
                              source)  # fmt: skip
            active, last_valid, status, errors = None, store.snapshot().last_valid, "quarantined", (why,)
        store.mirror(PolicySnapshot(generation, status, active, last_valid, source, errors))
        return {"seq": message.get("seq"), "generation": generation}

    async def _compile(self, document: JsonValue, source: str) -> CompiledPolicy | None:
        """A policy document the primary sent (its normalised JSON), compiled once per digest."""
        if not isinstance(document, dict):
            return None
        digest = str(document["digest"])
        found = self._compiled.get(digest)
        if found is None:
            found = await trio.to_thread.run_sync(self.cfg.policy.prepare, str(document["text"]), source)
            self._compiled = {**dict(list(self._compiled.items())[-1:]), digest: found}  # the last two
        return found

    async def _tell_stats(self) -> None:
        told: Message = {}
        while True:
            stats: Message = {
                "type": Kind.STATS, "live": self.egress.live_connections, "counters": dict(self.egress.counters),
                "links": self.peer.egress_up, "generation": self.cfg.policy.generation,
                "dropped": self.channel.dropped + self.log.dropped,
                "proxy": self.proxy.status() if self.proxy is not None else None,
            }  # fmt: skip
            if stats != told:
                self.channel.notify(stats)
                told = stats
            await trio.sleep(STATS_EVERY_S)


def _status(text: str) -> PolicyStatus:
    if text not in ("loaded", "quarantined", "retained"):
        raise ValueError(f"unknown policy status {text!r}")
    return text  # type: ignore[return-value]


def _error(raw: dict[str, JsonValue]) -> PolicyError:
    line = raw.get("line")
    return PolicyError(str(raw.get("path", "")), str(raw.get("message", "")),
                       None if raw.get("expected") is None else str(raw.get("expected")),
                       line if isinstance(line, int) else None,
                       None if raw.get("source") is None else str(raw.get("source")))  # fmt: skip


def _die_with_parent() -> None:
    """SIGKILL when the primary dies, however it dies (its channel's end closing covers the rest)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def run_worker(cfg: ControlConfig, index: int, sock: socket.socket, proxy: list[socket.socket] | None) -> int:
    """A forked worker's whole life; its exit status."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C reaches the group: the primary decides the end
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    try:
        return trio.run(Worker(cfg, index, sock, proxy).serve)
    except Exception as exc:
        traceback.print_exception(exc, file=sys.stderr)  # not one we expect: how it came about is the report
        print(f"openshell-sandbox: control worker {index}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
