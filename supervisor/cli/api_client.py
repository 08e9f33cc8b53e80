"""The CLI's client for control's operator API (h11 over the Unix socket, or over TCP with mutual TLS).

Finding the socket (docs/design.md "Finding the API"): ``--api``, else ``$OPENSHELL_SANDBOX_API``, else the only live
socket under ``<runtime directory>/*/api.sock`` (supervisor/protocol/runtime_dir.py), else an error listing
the candidates.

An API given as ``https://HOST:PORT`` is control's TCP listener (``--api-listen``; docs/design.md "Remote
operators"): the client presents the operator certificate in ``--cert DIR`` (else ``$OPENSHELL_SANDBOX_CERT``),
trusts only that bundle's CA, and checks that the server is this sandbox's control (role and every claim) before
it sends a byte of the request.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import trio

from supervisor.protocol.runtime_dir import runtime_base

UPGRADE_TOKEN = "openshell-channel"
CONNECT_TIMEOUT_S = 15.0


class ApiError(Exception):
    """The API answered with an error, or could not be reached; ``status`` 0 means no answer."""

    def __init__(self, message: str, status: int = 0, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {}


def _is_live(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


@dataclass(frozen=True)
class TlsApi:
    """Control's operator API on TCP: where it listens and the operator bundle that reaches it."""

    host: str
    port: int
    cert_dir: Path

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"


Api = Path | TlsApi


def parse_api_url(text: str, cert: str | None) -> TlsApi:
    """``https://HOST:PORT`` with the operator bundle directory ``cert``; ``ApiError`` naming what is wrong."""
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "https" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ApiError(f"--api {text!r}: a remote API is https://HOST:PORT")
    cert = cert or os.environ.get("OPENSHELL_SANDBOX_CERT")
    if not cert:
        raise ApiError(f"--api {text}: needs --cert DIR (an operator bundle: `certs issue --operator`)")
    return TlsApi(parts.hostname, port, Path(cert))


def add_api_arguments(parser: Any) -> None:
    """``--api`` and ``--cert``, the same on every client command."""
    parser.add_argument(
        "--api",
        help="operator API: a Unix socket path, or https://HOST:PORT for control's --api-listen (default: "
        "$OPENSHELL_SANDBOX_API, else the running sandbox's socket)",
    )
    parser.add_argument(
        "--cert",
        metavar="DIR",
        help="with an https:// API: the operator bundle directory (ca.pem cert.pem key.pem claims.json; "
        "default $OPENSHELL_SANDBOX_CERT)",
    )


def find_api(explicit: str | None = None, cert: str | None = None) -> Api:
    if explicit:
        return parse_api_url(explicit, cert) if explicit.startswith("https:") else Path(explicit)
    env = os.environ.get("OPENSHELL_SANDBOX_API")
    if env:
        return parse_api_url(env, cert) if env.startswith("https:") else Path(env)
    base = runtime_base()
    candidates = sorted(base.glob("*/api.sock")) if base.is_dir() else []
    live = [p for p in candidates if _is_live(p)]
    if len(live) == 1:
        return live[0]
    if not live:
        raise ApiError(f"no running sandbox found: no live API socket under {base} (use --api PATH)")
    listing = ", ".join(str(p) for p in live)
    raise ApiError(f"several sandboxes are running; choose one with --api: {listing}")


async def _connect(api: Api) -> trio.abc.HalfCloseableStream:
    if isinstance(api, TlsApi):
        return await _connect_tls(api)
    try:
        return await trio.open_unix_socket(str(api))
    except OSError as exc:
        raise ApiError(f"cannot reach the API at {api}: {exc.strerror or exc}") from None


async def _connect_tls(api: TlsApi) -> trio.abc.HalfCloseableStream:
    from supervisor.protocol.certs import BundleError, load_bundle
    from supervisor.protocol.claims import Role
    from supervisor.protocol.tls import ALPN_API, PeerRejected, client_context, verify_peer

    try:
        bundle = load_bundle(api.cert_dir, Role.OPERATOR)
        ctx = client_context(bundle, [ALPN_API])
    except BundleError as exc:
        raise ApiError(f"--cert: {exc}") from None
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            tcp = await trio.open_tcp_stream(api.host, api.port)
    except (OSError, trio.TooSlowError) as exc:
        raise ApiError(f"cannot reach the API at {api}: {getattr(exc, 'strerror', None) or exc or 'timeout'}") from None
    tls = trio.SSLStream(tcp, ctx, https_compatible=True)
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            await tls.do_handshake()
        verify_peer(tls, bundle, expected_alpn=ALPN_API, expected_role=Role.CONTROL)
    except PeerRejected as exc:
        await trio.aclose_forcefully(tls)
        raise ApiError(f"{api} is not this sandbox's control: {exc}") from None
    except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as exc:
        await trio.aclose_forcefully(tls)
        raise ApiError(f"TLS with {api} failed: {_cause(exc)}") from None
    return _TlsStream(tls, str(api))


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    return str(cause) or type(cause).__name__


class _TlsStream(trio.abc.HalfCloseableStream):
    """The TLS connection to a remote API. A refusal of our certificate arrives (TLS 1.3) as an alert on the first
    read after the handshake: it becomes an ``ApiError`` naming the alert. ``send_eof`` is a TLS close_notify
    (TLS 1.3 half-close): the API keeps answering until it is done."""

    def __init__(self, tls: trio.SSLStream[trio.SocketStream], where: str) -> None:
        self.tls = tls
        self.where = where
        self.received = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        from supervisor.link.tls_link import receive_after_close_notify

        try:
            data = await receive_after_close_notify(self.tls, max_bytes)
        except trio.BrokenResourceError as exc:
            if self.received:
                raise
            raise ApiError(f"{self.where} refused the connection: {_cause(exc)}") from None
        self.received = True
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self.tls.send_all(data)
        except trio.BrokenResourceError as exc:
            if self.received:
                raise
            raise ApiError(f"{self.where} refused the connection: {_cause(exc)}") from None

    async def wait_send_all_might_not_block(self) -> None:
        await self.tls.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        from supervisor.link.tls_link import send_close_notify

        await send_close_notify(self.tls)  # where it cannot be sent alone, just stop sending

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.tls)


async def _request(
    stream: trio.abc.HalfCloseableStream, method: str, target: str, body: bytes | None, extra: list[tuple[str, str]]
) -> tuple[h11.Connection, h11.Response | h11.InformationalResponse]:
    conn = h11.Connection(h11.CLIENT)
    headers = [("host", "openshell"), *extra]
    if body is not None:
        headers.append(("content-type", "application/json"))
        headers.append(("content-length", str(len(body))))
    data = conn.send(h11.Request(method=method, target=target, headers=headers))
    if body:
        data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    await stream.send_all(data)
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            chunk = bytes(await stream.receive_some(65536))
            conn.receive_data(chunk)
            if not chunk and conn.their_state is not h11.CLOSED:
                raise ApiError("the API closed the connection without answering")
            continue
        if isinstance(event, (h11.Response, h11.InformationalResponse)):
            return conn, event
        raise ApiError(f"unexpected answer from the API: {event!r}")


async def _read_body(stream: trio.abc.HalfCloseableStream, conn: h11.Connection) -> bytes:
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(65536)))
        elif isinstance(event, h11.Data):
            body += event.data
        else:
            return bytes(body)


def _decode(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return {"raw": data.decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"value": value}


async def request_json(
    path: Api, method: str, target: str, body: dict[str, Any] | bytes | None = None
) -> tuple[int, dict[str, Any]]:
    """One request; returns (status, JSON body) for any status."""
    payload = json.dumps(body).encode() if isinstance(body, dict) else body
    stream = await _connect(path)
    async with stream:
        conn, response = await _request(stream, method, target, payload, [])
        data = await _read_body(stream, conn)
    return response.status_code, _decode(data)


async def stream_lines(path: Api, target: str) -> AsyncIterator[bytes]:
    """``GET target`` answered with JSON lines: yield each line as it arrives, until the API ends the body."""
    stream = await _connect(path)
    async with stream:
        conn, response = await _request(stream, "GET", target, None, [])
        if response.status_code != 200:
            error = _decode(await _read_body(stream, conn))
            raise ApiError(str(error.get("reason") or f"HTTP {response.status_code}"), response.status_code, error)
        pending = b""
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                return  # the API went away mid-body (control stopped): the stream is over
            if event is h11.NEED_DATA:
                try:
                    conn.receive_data(bytes(await stream.receive_some(65536)))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            elif isinstance(event, h11.Data):
                *lines, pending = (pending + bytes(event.data)).split(b"\n")
                for line in lines:
                    yield line
            else:
                return


async def open_channel(
    path: Api, target: str, body: dict[str, Any]
) -> tuple[trio.abc.HalfCloseableStream, dict[str, Any]]:
    """Upgrade to an exec/forward channel; returns the raw stream and the boundary's accept reply."""
    stream = await _connect(path)
    try:
        conn, response = await _request(
            stream, "POST", target, json.dumps(body).encode(), [("connection", "upgrade"), ("upgrade", UPGRADE_TOKEN)]
        )
        if response.status_code != 101:
            data = await _read_body(stream, conn)
            error = _decode(data)
            raise ApiError(str(error.get("reason") or f"HTTP {response.status_code}"), response.status_code, error)
        reply = {}
        for name, value in response.headers:
            if name == b"openshell-reply":
                reply = _decode(value)
        leftover, _ = conn.trailing_data
        if leftover:
            return _Prefixed(stream, bytes(leftover)), reply
        return stream, reply
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


class _Prefixed(trio.abc.HalfCloseableStream):
    """A stream whose first bytes were already read by h11."""

    def __init__(self, inner: trio.abc.HalfCloseableStream, prefix: bytes) -> None:
        self._inner = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            await trio.lowlevel.checkpoint()
            return data
        return bytes(await self._inner.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def aclose(self) -> None:
        await self._inner.aclose()
