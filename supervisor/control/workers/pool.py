"""The primary's side of its workers: forking them before ``trio.run``, answering what has one owner (pins,
issued names, DNS), publishing each policy snapshot and holding ``policy.ack`` until every worker has it in
force, and folding the workers' events, links and counters into the primary's."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from supervisor.control.boundary_links import BoundaryLinks, LinkFailure
from supervisor.control.config import ControlConfig
from supervisor.control.egress import EgressService
from supervisor.control.peer import BoundaryPeer
from supervisor.control.policy.compiled import CompiledPolicy
from supervisor.control.policy.identity import BinaryIdentity
from supervisor.control.policy.store import PolicySnapshot
from supervisor.control.workers.channel import Channel, ChannelClosed
from supervisor.control.workers.wire import Kind, Message
from supervisor.jsonlog import JsonLog
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.json_value import JsonValue

REAP_WAIT_S = 2.0  # how long the primary waits for a worker to end after its channel closed, before SIGKILL
STOP_WAIT_S = 2.0  # how long control's end waits for its workers to end when told, reading their last events


@dataclass
class WorkerHandle:
    index: int
    pid: int
    pidfd: int  # opened before any wait: signals through it can never reach another process that reused the pid
    sock: socket.socket
    channel: Channel | None = None
    acked: int = 0  # the last snapshot (by sequence) this worker has in force
    generation: int = 0
    live: int = 0
    links: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    proxy: JsonValue = None
    dropped: int = 0
    reaped: bool = False  # its pid may name another process from then on: never signalled again

    def to_json(self) -> dict[str, JsonValue]:
        return {"index": self.index, "pid": self.pid, "generation": self.generation, "live": self.live,
                "links": self.links, "counters": dict(self.counters), "proxy": self.proxy,
                "events_dropped": self.dropped}  # fmt: skip

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):  # ended already, or the pidfd closed
            signal.pidfd_send_signal(self.pidfd, signal.SIGTERM)


def spawn(cfg: ControlConfig, count: int) -> tuple[list[WorkerHandle], list[socket.socket] | None]:
    """Fork ``count - 1`` workers (before ``trio.run``: nothing of trio's is copied). Returns the primary's
    handles and its own proxy sockets; in a worker it never returns (the worker runs, then ``_exit``s)."""
    from supervisor.control.proxy_listener import bind_shared
    from supervisor.control.workers.worker import run_worker

    proxy_sets = bind_shared(cfg.proxy, count) if cfg.proxy is not None else None
    handles: list[WorkerHandle] = []
    for index in range(1, count):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                ours.close()
                for handle in handles:  # its siblings' ends are the primary's alone
                    handle.sock.close()
                    os.close(handle.pidfd)
                for i, sockets in enumerate(proxy_sets or ()):
                    if i != index:
                        for sock in sockets:
                            sock.close()
                code = run_worker(cfg, index, theirs, proxy_sets[index] if proxy_sets else None)
            finally:
                os._exit(code)
        theirs.close()
        handles.append(WorkerHandle(index, pid, os.pidfd_open(pid), ours))
    if proxy_sets is not None:
        for sockets in proxy_sets[1:]:
            for sock in sockets:
                sock.close()
    return handles, proxy_sets[0] if proxy_sets is not None else None


class WorkerPool:
    def __init__(self, handles: list[WorkerHandle], log: JsonLog) -> None:
        self.handles = handles
        self.log = log
        self.egress: EgressService | None = None
        self.peer: BoundaryPeer | None = None
        self.links: BoundaryLinks | None = None
        self.queue_ack: Callable[[int], None] = lambda generation: None
        self._seq = 0
        self._latest: Message | None = None
        self._published = trio.Event()
        self._pending: list[tuple[int, int]] = []  # (sequence, generation) not yet in force in every worker
        self.in_force = 0  # the newest generation every worker has in force (the forked one to start with)
        self.exited: str | None = None  # why the pool failed: a worker ended
        self.stopping = False  # control is ending and told its workers to: their end is not a failure
        self._ended = 0
        self._all_ended = trio.Event()
        self._egress_started = False

    # -- what the primary asks of the pool -------------------------------------------------------------------
    def publish(self, snap: PolicySnapshot) -> None:
        """A new snapshot for every worker; its generation is acknowledged to the boundary once all have it."""
        self._seq += 1
        self._latest = {"type": Kind.POLICY, "seq": self._seq, "generation": snap.generation, "status": snap.status,
                        "source": snap.source, "policy": _document(snap.policy),
                        "last_valid": _document(snap.last_valid),
                        "errors": [e.to_json() for e in snap.errors]}  # fmt: skip
        self._pending.append((self._seq, snap.generation))
        self._published.set()
        self._published = trio.Event()

    def start_egress(self) -> None:
        self._egress_started = True  # a channel made later is told as it starts (serve)
        for handle in self.handles:
            if handle.channel is not None:
                handle.channel.notify({"type": Kind.START_EGRESS})

    async def stop_workers(self) -> None:
        """Tell every worker to end and keep reading their channels until they have (within ``STOP_WAIT_S``):
        the events of their last connections are logged before control's own end. :meth:`stop` ends the rest."""
        self.stopping = True
        for handle in self.handles:
            handle.terminate()
        if all(h.channel is not None for h in self.handles):  # else no channel is read: nothing to wait for
            with trio.move_on_after(STOP_WAIT_S):
                await self._all_ended.wait()

    @property
    def live(self) -> int:
        return sum(h.live for h in self.handles)

    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for handle in self.handles:
            for key, value in handle.counters.items():
                total[key] = total.get(key, 0) + value
        return total

    def status(self) -> list[JsonValue]:
        return [h.to_json() for h in self.handles]

    # -- serving ---------------------------------------------------------------------------------------------
    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve every worker's channel; returns (with ``exited`` set) as soon as one worker goes away."""
        self.log.emit(EventName.CONTROL_WORKERS, workers=len(self.handles) + 1,
                      pids=[os.getpid(), *(h.pid for h in self.handles)])  # fmt: skip
        async with trio.open_nursery() as nursery:
            for handle in self.handles:
                handle.channel = Channel(handle.sock)
                if self._egress_started:
                    handle.channel.notify({"type": Kind.START_EGRESS})
                nursery.start_soon(self._serve_one, handle, nursery.cancel_scope)
                nursery.start_soon(self._send_policy, handle)
            task_status.started()

    async def _serve_one(self, handle: WorkerHandle, scope: trio.CancelScope) -> None:
        assert handle.channel is not None
        await handle.channel.run(lambda message: self._handle(handle, message))
        status = await trio.to_thread.run_sync(_reap, handle.pid)
        handle.reaped = True
        self._ended += 1
        if self._ended == len(self.handles):
            self._all_ended.set()
        if self.stopping:  # told to end
            return
        self.exited = f"worker {handle.index} (pid {handle.pid}) ended: {status}"
        self.log.emit(EventName.CONTROL_WORKER_EXITED, worker=handle.index, pid=handle.pid, status=status)
        scope.cancel()

    async def _send_policy(self, handle: WorkerHandle) -> None:
        """Every snapshot to this worker in order, the newest only when several came meanwhile."""
        assert handle.channel is not None
        while True:
            latest = self._latest
            if latest is None or latest["seq"] == handle.acked:
                await self._published.wait()
                continue
            try:
                reply = await handle.channel.request(latest)
            except ChannelClosed:  # the worker ended: _serve_one says so and ends the daemon
                return
            seq = reply.get("seq")
            if isinstance(seq, int):
                handle.acked = seq
                self._acknowledge()

    def _acknowledge(self) -> None:
        done = min(h.acked for h in self.handles)
        while self._pending and self._pending[0][0] <= done:
            _, generation = self._pending.pop(0)
            self.in_force = generation
            self.queue_ack(generation)

    async def _handle(self, handle: WorkerHandle, message: Message) -> Message | None:
        kind = message["type"]
        egress = self.egress
        assert egress is not None
        if kind == Kind.EVENT:
            raw = message.get("event")
            if isinstance(raw, dict):
                try:
                    self.log.forward(Event.from_wire(raw))
                except ValueError:
                    pass
            return None
        if kind == Kind.PIN:  # recorded here if new: the first writer wins, whichever process it served
            path, digest = message.get("path"), message.get("sha256")
            if isinstance(path, str) and isinstance(digest, str):
                egress.pins.verify(BinaryIdentity(path, digest))
                return {"pinned": egress.pins.pinned(path)}
            return {"pinned": None}
        if kind == Kind.ISSUED:
            address = message.get("address")
            return {"names": list(egress.issued_for(address)) if isinstance(address, str) else []}
        if kind == Kind.DNS_QUERY:
            wire = message.get("wire")
            answer = await egress.answer_wire(base64.b64decode(wire)) if isinstance(wire, str) else b""
            return {"wire": base64.b64encode(answer).decode()}
        if kind == Kind.STATS:
            self._stats(handle, message)
        elif kind == Kind.LINKS:
            self._links(message)
        elif kind == Kind.LINK_FAILED:
            self._link_failed(handle, message)
        return None

    def _stats(self, handle: WorkerHandle, message: Message) -> None:
        live, generation, links, dropped = (message.get(k) for k in ("live", "generation", "links", "dropped"))
        counters = message.get("counters")
        handle.live = live if isinstance(live, int) else handle.live
        handle.generation = generation if isinstance(generation, int) else handle.generation
        handle.links = links if isinstance(links, int) else handle.links
        handle.dropped = dropped if isinstance(dropped, int) else handle.dropped
        if isinstance(counters, dict):
            handle.counters = {k: v for k, v in counters.items() if isinstance(v, int)}
        handle.proxy = message.get("proxy")

    def _links(self, message: Message) -> None:
        delta = message.get("delta")
        if self.peer is None or not isinstance(delta, int):
            return
        if delta > 0:
            for _ in range(delta):
                self.peer.egress_link_up()
        else:
            self.peer.egress_up += delta

    def _link_failed(self, handle: WorkerHandle, message: Message) -> None:
        if self.links is None:
            return
        step, reason, field_, alpn, delay = (message.get(k) for k in ("step", "reason", "field", "alpn", "delay"))
        failure = LinkFailure(str(step), None if field_ is None else str(field_), str(reason))
        if self.links.said_agent_ended(failure):
            return
        extra = message.get("extra")
        fields = {k: v for k, v in extra.items()} if isinstance(extra, dict) else {}
        self.links.say_failed(str(alpn), failure, float(delay) if isinstance(delay, int | float) else 0.0,
                              worker=handle.index, **fields)  # fmt: skip

    def stop(self) -> None:
        """After ``trio.run``: every worker ended (SIGTERM, then SIGKILL past ``REAP_WAIT_S``) and reaped."""
        for handle in self.handles:
            handle.sock.close()
            if not handle.reaped:
                _reap(handle.pid, terminate=True)
                handle.reaped = True
            os.close(handle.pidfd)


def _document(policy: CompiledPolicy | None) -> JsonValue:
    if policy is None:
        return None
    return {"digest": policy.digest, "text": json.dumps(policy.policy.to_json(), separators=(",", ":"))}


def _reap(pid: int, *, terminate: bool = False) -> str:
    """Wait for our child ``pid`` to end (SIGTERM first with ``terminate``; SIGKILL past ``REAP_WAIT_S``) and
    reap it; how it ended. Waits on a pidfd, so no signal can reach another process that reused the pid."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # reaped already
        return "reaped"
    try:
        if terminate:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        ready, _, _ = select.select([pidfd], [], [], REAP_WAIT_S)
        if not ready:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [])
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return "reaped"
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.waitstatus_to_exitcode(status)}"
