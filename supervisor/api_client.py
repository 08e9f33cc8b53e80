"""The CLI's client for control's operator API (h11 over the Unix socket).

Finding the socket (docs/design.md "Finding the API"): ``--api``, else ``$OPENSHELL_SANDBOX_API``, else the only live
socket under ``${XDG_RUNTIME_DIR:-/run}/openshell-sandbox/*/api.sock``, else an error listing the candidates.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import h11
import trio

UPGRADE_TOKEN = "openshell-channel"


class ApiError(Exception):
    """The API answered with an error, or could not be reached; ``status`` 0 means no answer."""

    def __init__(self, message: str, status: int = 0, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {}


def _runtime_base() -> Path:
    return Path(os.environ.get("XDG_RUNTIME_DIR") or "/run") / "openshell-sandbox"


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


def find_api(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("OPENSHELL_SANDBOX_API")
    if env:
        return Path(env)
    base = _runtime_base()
    candidates = sorted(base.glob("*/api.sock")) if base.is_dir() else []
    live = [p for p in candidates if _is_live(p)]
    if len(live) == 1:
        return live[0]
    if not live:
        raise ApiError(f"no running sandbox found: no live API socket under {base} (use --api PATH)")
    listing = ", ".join(str(p) for p in live)
    raise ApiError(f"several sandboxes are running; choose one with --api: {listing}")


async def _connect(path: Path) -> trio.SocketStream:
    try:
        return await trio.open_unix_socket(str(path))
    except OSError as exc:
        raise ApiError(f"cannot reach the API at {path}: {exc.strerror or exc}") from None


async def _request(
    stream: trio.SocketStream, method: str, target: str, body: bytes | None, extra: list[tuple[str, str]]
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
            chunk = await stream.receive_some(65536)
            conn.receive_data(chunk)
            if not chunk and conn.their_state is not h11.CLOSED:
                raise ApiError("the API closed the connection without answering")
            continue
        if isinstance(event, (h11.Response, h11.InformationalResponse)):
            return conn, event
        raise ApiError(f"unexpected answer from the API: {event!r}")


async def _read_body(stream: trio.SocketStream, conn: h11.Connection) -> bytes:
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
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
    path: Path, method: str, target: str, body: dict[str, Any] | bytes | None = None
) -> tuple[int, dict[str, Any]]:
    """One request; returns (status, JSON body) for any status."""
    payload = json.dumps(body).encode() if isinstance(body, dict) else body
    stream = await _connect(path)
    async with stream:
        conn, response = await _request(stream, method, target, payload, [])
        data = await _read_body(stream, conn)
    return response.status_code, _decode(data)


async def stream_lines(path: Path, target: str) -> AsyncIterator[bytes]:
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
                    conn.receive_data(await stream.receive_some(65536))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            elif isinstance(event, h11.Data):
                *lines, pending = (pending + bytes(event.data)).split(b"\n")
                for line in lines:
                    yield line
            else:
                return


async def open_channel(path: Path, target: str, body: dict[str, Any]) -> tuple[trio.SocketStream, dict[str, Any]]:
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
            return _Prefixed(stream, bytes(leftover)), reply  # type: ignore[return-value]
        return stream, reply
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


class _Prefixed(trio.abc.HalfCloseableStream):
    """A stream whose first bytes were already read by h11."""

    def __init__(self, inner: trio.SocketStream, prefix: bytes) -> None:
        self._inner = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            await trio.lowlevel.checkpoint()
            return data
        return await self._inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def aclose(self) -> None:
        await self._inner.aclose()
