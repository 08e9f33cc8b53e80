"""Operations as HTTP/2 requests on a link: unary JSON calls and streaming channels.

Two shapes, both on one HTTP/2 stream each:

* **unary** (attach, confirm, start, status, wait, signal, …): the request body is a JSON object, END_STREAM;
  the reply is ``:status`` plus a JSON body. A non-2xx status carries an error body (``OpError.to_json``).
* **channel** (exec, forward): the request body starts with a 4-byte big-endian length and that many bytes of
  JSON, then raw bytes for the rest of the stream's life. The reply is ``:status 200`` with the reply object in
  the ``openshell-reply`` header, then raw bytes; or an error status with an error body, END_STREAM.

The router answers every request it cannot place with ``invalid`` and turns :class:`OpError` into the error
reply, so a handler only raises.

Each operation's request and reply is a frozen dataclass in ``supervisor/protocol`` with ``to_wire``/``from_wire``:
a handler is registered with its request type and gets the typed value (:meth:`Router.unary`), a caller gets the
typed reply (:func:`call_typed`, :func:`open_channel_typed`). The raw forms (:func:`call`, :func:`open_channel`,
:meth:`Router.unary_raw`, :meth:`Router.channel_raw`) stay for what relays JSON objects unread — control's API
passes the operator's wait, signal, terminate, exec, forward and attach-stream through, so the boundary's
lifecycle check still answers before its parser — and for tests of the transport itself.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

import trio

from supervisor.link.h2link import Headers, Link, LinkClosed, LinkStream
from supervisor.protocol.errors import ErrorKind, OpError

JSON_LIMIT = 4 * 1024 * 1024
REPLY_HEADER = "openshell-reply"

UnaryHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Message(Protocol):
    """What goes on the link: a request or a reply that writes its JSON object."""

    def to_wire(self) -> dict[str, Any]: ...


class WireType(Protocol[T_co]):
    """A request or reply class: ``from_wire`` turns the decoded JSON object into the typed value, or refuses it
    (an :class:`OpError` naming the operation and the field)."""

    def from_wire(self, obj: object, /) -> T_co: ...


Accept = Callable[[Message], Awaitable[None]]
"""A channel handler's way to accept: the reply goes in the ``openshell-reply`` header, then the stream's bytes."""


RawAccept = Callable[[dict[str, Any]], Awaitable[None]]
ChannelHandler = Callable[[dict[str, Any], LinkStream, RawAccept], Awaitable[None]]


def request_headers(method: str, path: str, authority: str = "openshell") -> Headers:
    return [(":method", method), (":scheme", "https"), (":authority", authority), (":path", path)]


def _decode_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data) if data else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise OpError(ErrorKind.INVALID, f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise OpError(ErrorKind.INVALID, f"{what} must be a JSON object")
    return value


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# -- client side ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _exchange(path: str) -> Iterator[None]:
    """The one place a lost link becomes an error kind: every client operation runs its whole exchange (opening
    the stream included) inside it, so a caller only ever sees :class:`OpError`."""
    try:
        yield
    except (LinkClosed, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise OpError(ErrorKind.UNAVAILABLE, f"{path}: link lost: {exc}") from exc


async def call(link: Link, path: str, body: dict[str, Any] | None = None, *, method: str = "POST") -> dict[str, Any]:
    """One unary operation; raises :class:`OpError` with the peer's kind on an error reply, ``unavailable`` when
    the link is lost at any point of the exchange."""
    payload = _encode(body or {})
    with _exchange(path):
        stream = await link.open_stream(
            [*request_headers(method, path), ("content-type", "application/json")], end_stream=True, body=payload
        )
        try:
            await stream.response()
            data = await stream.read_all(JSON_LIMIT)
        finally:
            await stream.aclose()
    reply = _decode_object(data, f"reply to {path}")
    if not 200 <= stream.status < 300:
        raise OpError.from_json(reply, status=stream.status)
    return reply


async def call_typed(link: Link, path: str, request: Message, reply_type: WireType[T]) -> T:
    """:func:`call` with the request written by its ``to_wire`` and the reply read by ``reply_type.from_wire``."""
    return reply_type.from_wire(await call(link, path, request.to_wire()))


async def open_channel(link: Link, path: str, body: dict[str, Any]) -> tuple[LinkStream, dict[str, Any]]:
    """Start a channel operation; returns the open stream and the accept reply, or raises :class:`OpError`
    (``unavailable`` when the link is lost before the reply)."""
    payload = _encode(body)
    with _exchange(path):
        stream = await link.open_stream(request_headers("POST", path), body=struct.pack(">I", len(payload)) + payload)
        try:
            await stream.response()
            if stream.status == 200:
                return stream, _decode_object((stream.header(REPLY_HEADER) or "{}").encode(), f"reply to {path}")
            data = await stream.read_all(JSON_LIMIT)
        except BaseException:
            await stream.aclose()
            raise
        await stream.aclose()
    raise OpError.from_json(_decode_object(data, f"reply to {path}"), status=stream.status)


async def open_channel_typed(link: Link, path: str, request: Message, reply_type: WireType[T]) -> tuple[LinkStream, T]:
    """:func:`open_channel` with the request written by its ``to_wire`` and the accept reply read by
    ``reply_type.from_wire`` (the stream is closed if the reply is refused)."""
    stream, reply = await open_channel(link, path, request.to_wire())
    try:
        return stream, reply_type.from_wire(reply)
    except BaseException:
        await stream.aclose()
        raise


# -- server side ----------------------------------------------------------------------------------------------


class Router:
    """Maps ``(method, path)`` to handlers; serves one link's request streams."""

    def __init__(self) -> None:
        self._unary: dict[tuple[str, str], UnaryHandler] = {}
        self._channel: dict[str, ChannelHandler] = {}
        # unary calls whose handler has finished and whose reply is not yet handed to the transport
        self._replying = 0
        self._replies_flushed = trio.Event()

    def unary(
        self,
        path: str,
        request_type: WireType[T],
        handler: Callable[[T], Awaitable[Message]],
        *,
        before: Callable[[], None] | None = None,
        refused: Callable[[OpError], None] | None = None,
        method: str = "POST",
    ) -> None:
        """Serve ``path`` with ``handler``, which gets the request as ``request_type`` and returns its reply.
        ``before`` is what must hold before the request is even read (the lifecycle state): its refusal is the
        answer whatever the body says. ``refused`` sees every refusal after that, of the request or by the handler,
        before it is answered (a refused attach ends the boundary)."""

        async def serve(body: dict[str, Any]) -> dict[str, Any]:
            if before is not None:
                before()
            try:
                reply = await handler(request_type.from_wire(body))
            except OpError as exc:
                if refused is not None:
                    refused(exc)
                raise
            return reply.to_wire()

        self._unary[(method, path)] = serve

    def unary_raw(self, path: str, handler: UnaryHandler, method: str = "POST") -> None:
        """Serve ``path`` with a handler of JSON objects (tests of the transport)."""
        self._unary[(method, path)] = handler

    def channel(
        self,
        path: str,
        request_type: WireType[T],
        handler: Callable[[T, LinkStream, Accept], Awaitable[None]],
        *,
        before: Callable[[], None] | None = None,
    ) -> None:
        """As :meth:`unary`, for a channel: ``handler`` gets the typed request, the stream and ``accept``."""

        async def serve(body: dict[str, Any], stream: LinkStream, accept: RawAccept) -> None:
            if before is not None:
                before()

            async def accept_typed(reply: Message) -> None:
                await accept(reply.to_wire())

            await handler(request_type.from_wire(body), stream, accept_typed)

        self._channel[path] = serve

    def channel_raw(self, path: str, handler: ChannelHandler) -> None:
        """Serve channel ``path`` with a handler of JSON objects (tests of the transport)."""
        self._channel[path] = handler

    async def handle(self, stream: LinkStream) -> None:
        method = stream.header(":method") or ""
        path = (stream.header(":path") or "").split("?", 1)[0]
        replying = False
        try:
            if (method, path) in self._unary:
                body = _decode_object(await stream.read_all(JSON_LIMIT), f"{path} request")
                try:
                    reply = await self._unary[(method, path)](body)
                finally:
                    # counted from the moment the handler ends (no checkpoint in between), so whatever the handler
                    # woke up sees this reply as pending in :meth:`replies_flushed`
                    replying = True
                    self._replying += 1
                await _send_json(stream, 200, reply)
            elif method == "POST" and path in self._channel:
                await self._serve_channel(stream, path)
            else:
                raise OpError(ErrorKind.INVALID, f"no operation {method} {path}")
        except OpError as exc:
            await _send_error(stream, exc)
        except LinkClosed:
            return
        finally:
            if replying:
                try:
                    await stream.flush()
                finally:
                    self._replying -= 1
                    if not self._replying:
                        self._replies_flushed.set()
                        self._replies_flushed = trio.Event()

    async def replies_flushed(self) -> None:
        """Wait until every unary call whose handler has already finished has its reply handed to the transport
        (or its link closed). A daemon that ends right after an operation (an acknowledged exit, a refused attach)
        waits on this instead of sleeping, so the peer gets the reply before the connection goes."""
        while self._replying:
            await self._replies_flushed.wait()

    async def _serve_channel(self, stream: LinkStream, path: str) -> None:
        head = await _read_exactly(stream, 4)
        (size,) = struct.unpack(">I", head)
        if size > JSON_LIMIT:
            raise OpError(ErrorKind.INVALID, f"{path} request larger than {JSON_LIMIT} bytes")
        body = _decode_object(await _read_exactly(stream, size), f"{path} request")
        accepted = False

        async def accept(reply: dict[str, Any]) -> None:
            nonlocal accepted
            accepted = True
            reply_header = (REPLY_HEADER, json.dumps(reply, separators=(",", ":")))
            await stream.send_headers([(":status", "200"), reply_header], now=True)  # the channel's data may wait

        try:
            await self._channel[path](body, stream, accept)
        except OpError:
            if accepted:
                await stream.reset()
                return
            raise


async def _read_exactly(stream: LinkStream, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        data = await stream.receive_some(size - len(buf))
        if not data:
            raise OpError(ErrorKind.INVALID, "request ended early")
        buf += data
    return bytes(buf)


async def _send_json(stream: LinkStream, status: int, body: dict[str, Any]) -> None:
    payload = _encode(body)
    await stream.send_headers(
        [(":status", str(status)), ("content-type", "application/json"), ("content-length", str(len(payload)))]
    )
    await stream.send_final(payload)


async def _send_error(stream: LinkStream, error: OpError) -> None:
    try:
        await _send_json(stream, error.kind.http_status, error.to_json())
    except (LinkClosed, trio.ClosedResourceError):
        pass
