"""The operator API: HTTP/1.1 (h11) on a Unix socket in a 0700 directory of control's uid.

Unary endpoints answer JSON (``GET /v1/denials?since=MS``: the denials control aggregated for the policy advisor,
with the policy in force and the paths the agent can write). ``GET /v1/events?tail=N&event=KIND&follow=1`` answers
JSON lines (chunked): the last N (default 100) of control's recent events, of the given kinds (repeatable; a kind
matches its dotted family), then, with ``follow``, every new one until the client goes away; the connection closes
after it.
``exec`` and ``forward`` are ``POST`` with ``Connection: Upgrade`` and
``Upgrade: openshell-channel``: control opens the matching channel on the ops link and, once the boundary has
accepted, answers ``101 Switching Protocols`` and splices raw bytes — the exec channel framing is end to end
between the CLI and the boundary, control never parses it. Errors carry the operation's kind and status.

The same API is served on TCP with mutual TLS to ``operator`` certificates when control has ``--api-listen``
(``api_tls.py``); there every request is logged with the certificate's identity (``api.operator``) before it acts.
"""

from __future__ import annotations

import json
import math
import os
import select
import stat
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import h11
import trio

from supervisor.control.events import EventBuffer
from supervisor.control.policy import PolicyInvalid, PolicyStore
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link
from supervisor.link.relay import close_now, relay
from supervisor.link.rpc import call, open_channel
from supervisor.protocol.agent_ended import after_agent_end
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.exit_result import ExitResult
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.lifecycle import Op
from supervisor.protocol.runtime_dir import ensure_runtime_base


class ControlState(Protocol):
    """What the API serves from control (``daemon.ControlDaemon`` is the one implementation; declared here so
    that this module does not import the daemon that imports it)."""

    @property
    def events(self) -> EventBuffer: ...
    @property
    def ops(self) -> Link | None: ...  # the ops link to the boundary, while it is up
    @property
    def policy(self) -> PolicyStore: ...
    @property
    def agent_result(self) -> ExitResult | None: ...  # the last agent result the boundary told control
    @property
    def topology(self) -> str: ...
    def readiness(self) -> list[str]: ...
    def status(self) -> dict[str, JsonValue]: ...
    def denials_json(self, since_ms: int | None) -> dict[str, JsonValue]: ...
    def activity(self) -> dict[str, JsonValue]: ...
    async def refresh_status(self) -> dict[str, JsonValue]: ...


UPGRADE_TOKEN = "openshell-channel"
MAX_BODY = 4 * 1024 * 1024
DEFAULT_EVENTS_TAIL = 100
FORWARDED_UNARY = {"/v1/wait": 0, "/v1/signal": 0, "/v1/terminate": 0}
# the lifecycle operation each forwarded request is (attach-stream is checked as exec, as the boundary does)
_OPS = {"/v1/wait": Op.WAIT, "/v1/signal": Op.SIGNAL, "/v1/terminate": Op.TERMINATE, "/v1/exec": Op.EXEC,
        "/v1/forward": Op.FORWARD, "/v1/attach-stream": Op.EXEC}  # fmt: skip


def runtime_socket_path(sandbox: str) -> Path:
    """docs/design.md "Finding the API": ``<runtime directory>/<sandbox>/api.sock``, the runtime directory made
    and checked (supervisor/protocol/runtime_dir.py)."""
    return ensure_runtime_base() / sandbox / "api.sock"


def _prepare_socket_dir(path: Path) -> None:
    if len(os.fsencode(path)) > 107:
        raise OSError(f"API socket path {path} is longer than the 107 bytes a Unix socket allows (use --api)")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    info = path.parent.stat()
    if info.st_uid != os.geteuid():
        raise OSError(f"{path.parent} is owned by uid {info.st_uid}, not control's uid {os.geteuid()}")
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise OSError(f"{path} exists and is not a socket")
        path.unlink()


class _Http:
    """Minimal h11 driving for one connection."""

    def __init__(self, stream: trio.abc.HalfCloseableStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.SERVER)

    async def next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                data = await self.stream.receive_some(65536)
                self.conn.receive_data(bytes(data))
                continue
            return event

    async def send(self, event: Any) -> None:
        data = self.conn.send(event)
        if data:
            await self.stream.send_all(data)

    async def respond_json(self, status: int, body: dict[str, JsonValue]) -> None:
        payload = json.dumps(body, indent=None, separators=(",", ":")).encode() + b"\n"
        headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]
        await self.send(h11.Response(status_code=status, headers=headers))
        await self.send(h11.Data(data=payload))
        await self.send(h11.EndOfMessage())


class ApiServer:
    def __init__(self, daemon: ControlState, path: Path, *, log: JsonLog) -> None:
        self.daemon = daemon
        self.path = path
        self.log = log

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        _prepare_socket_dir(self.path)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            await sock.bind(str(self.path))
        finally:
            os.umask(old)
        sock.listen(64)
        listener = trio.SocketListener(sock)
        self.log.emit(EventName.API_LISTENING, path=str(self.path))
        task_status.started()
        try:
            await trio.serve_listeners(self._connection, [listener])
        finally:
            try:
                self.path.unlink()
            except OSError:
                pass

    async def _connection(self, stream: trio.SocketStream) -> None:
        await self.handle(stream)

    async def handle(
        self, stream: trio.abc.HalfCloseableStream, *, operator: dict[str, str] | None = None, peer: str | None = None
    ) -> None:
        """Serve one connection: the Unix socket's (``operator`` None) or an operator's over TLS."""
        http = _Http(stream)
        try:
            while True:
                request = await http.next_event()
                if not isinstance(request, h11.Request):
                    return
                body = bytearray()
                while True:
                    event = await http.next_event()
                    if isinstance(event, h11.Data):
                        body += event.data
                        if len(body) > MAX_BODY:
                            await http.respond_json(413, {"kind": "invalid", "reason": "request body too large"})
                            return
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return
                if operator is not None:
                    self._log_action(request, bytes(body), operator, peer)
                upgraded = await self._dispatch(http, request, bytes(body))
                if upgraded or http.conn.our_state is h11.MUST_CLOSE:
                    return
                http.conn.start_next_cycle()
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await close_now(stream)

    def _log_action(self, request: h11.Request, body: bytes, operator: dict[str, str], peer: str | None) -> None:
        """One ``api.operator`` line per request from a remote operator, naming its certificate and what it asks."""
        detail: dict[str, JsonValue] = {}
        target = request.target.decode("ascii", "replace")
        if target.split("?", 1)[0] in ("/v1/exec", "/v1/forward", "/v1/attach-stream", *FORWARDED_UNARY):
            try:
                parsed = json.loads(body) if body else {}
            except ValueError:
                parsed = {}
            if isinstance(parsed, dict):
                keys = ("argv", "cwd", "tty", "host", "port", "handle", "signal", "scope", "grace_s")
                detail = {key: parsed[key] for key in keys if key in parsed}
        elif target.split("?", 1)[0] == "/v1/policy" and request.method == b"PUT":
            import hashlib

            detail = {"policy_sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}
        # The action first: `logs` shows the fields in this order and cuts long lines.
        self.log.emit(EventName.API_OPERATOR, action=f"{request.method.decode()} {target}", request=detail or None,
                      peer=peer, operator=operator)  # fmt: skip

    async def _dispatch(self, http: _Http, request: h11.Request, body: bytes) -> bool:
        method = request.method.decode()
        raw_target = request.target.decode()
        target = raw_target.split("?", 1)[0]
        if method == "GET" and target == "/v1/events":
            await self._events(http, raw_target)
            return True  # the stream ended: close the connection
        if method == "PUT" and target == "/v1/policy":  # the body is the policy YAML, not JSON
            await self._put_policy(http, body)
            return False
        try:
            parsed = json.loads(body) if body else {}
            if not isinstance(parsed, dict):
                raise OpError(ErrorKind.INVALID, "request body must be a JSON object")
        except ValueError as exc:
            await http.respond_json(400, {"kind": "invalid", "reason": f"request body is not JSON: {exc}"})
            return False
        try:
            if method == "GET" and target == "/healthz":
                await http.respond_json(200, {"ok": True})
            elif method == "GET" and target == "/readyz":
                failing = self.daemon.readiness()
                await http.respond_json(503 if failing else 200, {"ready": not failing, "failing": list(failing)})
            elif method == "GET" and target == "/v1/status":
                await self.daemon.refresh_status()
                await http.respond_json(200, self.daemon.status())
            elif method == "GET" and target == "/v1/denials":
                await http.respond_json(200, self.daemon.denials_json(_since_ms(raw_target)))
            elif method == "GET" and target == "/v1/activity":
                await http.respond_json(200, self.daemon.activity())
            elif method == "GET" and target == "/v1/policy":
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(raw_target).query)
                content = query.get("content", ["0"])[-1] in ("1", "true", "yes")
                await http.respond_json(200, self.daemon.policy.status_json(content=content))
            elif method == "POST" and target in FORWARDED_UNARY:
                ended = self._after_agent_end(target, parsed)
                reply = ended.to_wire() if ended is not None else await call(self._link(), target, parsed)
                await http.respond_json(200, reply)
            elif method == "POST" and target in ("/v1/exec", "/v1/forward", "/v1/attach-stream"):
                if target == "/v1/attach-stream" and "handle" not in parsed:  # also ?handle=
                    query = urllib.parse.parse_qs(urllib.parse.urlsplit(raw_target).query)
                    parsed = {"handle": query.get("handle", [""])[-1]}
                self._after_agent_end(target, parsed)  # once the agent has ended: terminated, naming why
                return await self._channel(http, request, target, parsed)
            else:
                raise OpError(ErrorKind.INVALID, f"no endpoint {method} {target}")
        except OpError as exc:
            await http.respond_json(exc.kind.http_status, exc.to_json())
        return False

    async def _events(self, http: _Http, raw_target: str) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(raw_target).query)
        tail_text = query.get("tail", [str(DEFAULT_EVENTS_TAIL)])[-1]
        if not tail_text.isdigit():
            await http.respond_json(400, {"kind": "invalid", "reason": f"tail must be a count, got {tail_text!r}"})
            return
        follow = query.get("follow", ["0"])[-1].lower() in ("1", "true", "yes")
        kinds = query.get("event", [])
        buffer = self.daemon.events
        events, seq = buffer.tail(int(tail_text), kinds)
        await http.send(h11.Response(status_code=200, headers=[("content-type", "application/x-ndjson")]))
        if events:
            await http.send(h11.Data(data=_json_lines(events)))
        if follow:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_at_eof, http.stream, nursery.cancel_scope)
                while True:
                    await buffer.wait_after(seq)
                    events, seq = buffer.after(seq, kinds)
                    if events:
                        await http.send(h11.Data(data=_json_lines(events)))
        await http.send(h11.EndOfMessage())

    def _after_agent_end(self, target: str, body: dict[str, JsonValue]) -> ExitResult | None:
        """Once the boundary told us the agent's result, we answer from it, present boundary or not
        (protocol/agent_ended.py): the result itself, or ``terminated``; ``None``: ask the boundary."""
        result = self.daemon.agent_result
        if result is None or self.daemon.topology == "proxy-pod":
            return None
        handle = body.get("handle")
        link = self.daemon.ops
        return after_agent_end(_OPS[target], handle if isinstance(handle, str) else None, result,
                               boundary_attached=link is not None and not link.closed)  # fmt: skip

    def _link(self) -> Link:
        if self.daemon.topology == "proxy-pod":  # no supervisor next to the workload (docs/design.md)
            raise OpError(ErrorKind.INVALID, "not available in the proxy-pod topology: the workload runs no "
                          "supervisor (no exec, PTY, forward, signal, wait or process policy)")  # fmt: skip
        link = self.daemon.ops
        if link is None or link.closed:
            raise OpError(ErrorKind.UNAVAILABLE, "the boundary is not attached (no ops link)")
        return link

    async def _put_policy(self, http: _Http, body: bytes) -> None:
        try:
            generation = await self.daemon.policy.apply_text_async(body.decode("utf-8", "replace"), "PUT /v1/policy")
        except PolicyInvalid as exc:
            errors = [err.to_json() for err in exc.errors]
            await http.respond_json(400, {"kind": "invalid", "reason": "policy rejected", "errors": list(errors)})
            return
        self.log.emit(EventName.POLICY_APPLIED, generation=generation, source="api")
        await http.respond_json(200, self.daemon.policy.status_json())

    async def _channel(self, http: _Http, request: h11.Request, target: str, body: dict[str, JsonValue]) -> bool:
        wants_upgrade = any(
            name.lower() == b"upgrade" and value.decode().lower() == UPGRADE_TOKEN for name, value in request.headers
        )
        if not wants_upgrade:
            raise OpError(ErrorKind.INVALID, f"{target} needs 'Connection: Upgrade' and 'Upgrade: {UPGRADE_TOKEN}'")
        channel, reply = await open_channel(self._link(), target, body)
        try:
            await http.send(
                h11.InformationalResponse(
                    status_code=101,
                    headers=[
                        ("connection", "upgrade"),
                        ("upgrade", UPGRADE_TOKEN),
                        ("openshell-reply", json.dumps(reply, separators=(",", ":"))),
                    ],
                )
            )
            leftover, _closed = http.conn.trailing_data
            if leftover:
                await channel.send_all(leftover)
            await relay(_HangupAware(http.stream, lambda: channel.remote_ended), channel, idle_timeout=math.inf)
        finally:
            await channel.aclose()
        return True


class _HangupAware(trio.abc.HalfCloseableStream):
    """The API client's side of a channel relay, telling a client that went away from one that half-closed.

    A half-close is meaningful on a channel (an exec's stdin EOF; spec §2.3), but a client that died (the CLI
    killed mid-exec) must not look like one: the relay would go on taking the process's output from the
    boundary and lose it in a dead socket, and ``attach HANDLE`` would find nothing buffered. On a Unix socket
    the kernel says which it was: a peer that closed (or died) leaves POLLHUP, a half-close does not. Then the
    EOF is a failure, the relay aborts both sides, the boundary's stream is reset, and the boundary keeps the
    process running with its output buffered for a re-attach. (On TCP a FIN is the same either way; there the
    first write to the dead client fails and aborts the relay instead.)

    Once the channel's far side has ended (``finished``: the boundary sent its last frame, an exec's EXIT), a
    client closing is how the exchange ends, not a failure: nothing is left to keep, and an orderly close of the
    relay costs neither side a reset.
    """

    def __init__(self, stream: trio.abc.HalfCloseableStream, finished: Callable[[], bool] = lambda: False) -> None:
        self._stream = stream
        self.closes_at_once = isinstance(stream, trio.SocketStream)  # relay.close_now
        self._finished = finished
        self.transport_stream = stream  # what relay.abort_stream unwraps to reach the socket
        sock = getattr(stream, "socket", None)
        self._fd = sock.fileno() if sock is not None and sock.family == trio.socket.AF_UNIX else None

    def _hung_up(self) -> bool:
        if self._fd is None:
            return False
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP)
        return any(mask & select.POLLHUP for _fd, mask in poller.poll(0))

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._stream.receive_some(max_bytes)
        if not data and not self._finished() and self._hung_up():
            raise trio.BrokenResourceError("the API client closed its connection")
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


def _since_ms(raw_target: str) -> int | None:
    """``?since=MS``: milliseconds since the epoch (``policy suggest --since`` converts a time or a duration)."""
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(raw_target).query).get("since", [])
    if not values:
        return None
    if not values[-1].isdigit():
        raise OpError(ErrorKind.INVALID, f"since must be milliseconds since the epoch, got {values[-1][:40]!r}")
    return int(values[-1])


def _json_lines(events: list[Event]) -> bytes:
    return "".join(event.json_line() for event in events).encode()


async def _cancel_at_eof(stream: trio.abc.ReceiveStream, scope: trio.CancelScope) -> None:
    """A follower is done when its client closes (it sends nothing after the request)."""
    try:
        while await stream.receive_some(4096):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    scope.cancel()
