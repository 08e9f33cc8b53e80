"""Small stream helpers for inspection: replay sniffed bytes, abort a stack of streams, close politely."""

from __future__ import annotations

from typing import Any

import trio

from supervisor.link.relay import abort_stream

__all__ = ["Outbox", "PrefixedStream", "abort_all", "innermost"]


class PrefixedStream(trio.abc.HalfCloseableStream):
    """``inner`` with ``prefix`` (bytes already read from it while sniffing) put back in front."""

    def __init__(self, inner: trio.abc.HalfCloseableStream, prefix: bytes) -> None:
        self.transport_stream = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            chunk, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return chunk
        return bytes(await self.transport_stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.transport_stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.transport_stream.send_eof()

    async def aclose(self) -> None:
        await self.transport_stream.aclose()


class Outbox:
    """What a pump has yet to write: h11's pieces (``send_with_data_passthrough``) kept as they came and joined
    once per write, so a body chunk is copied once on its way out, not once per step."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes | bytearray | memoryview] = []
        self.size = 0

    def add(self, pieces: list[bytes] | None) -> None:
        if pieces:
            self.parts += pieces
            self.size += sum(map(len, pieces))

    def take(self) -> bytes:
        """Everything held, as one buffer (the one piece itself when it is the only one), and empty again."""
        data = b"".join(self.parts)  # one ``bytes`` piece is returned as it is, not copied
        self.parts.clear()
        self.size = 0
        return data


def innermost(stream: Any) -> Any:
    """Follow ``transport_stream`` (SSLStream, PrefixedStream) down to the stream that owns the transport."""
    while getattr(stream, "transport_stream", None) is not None:
        stream = stream.transport_stream
    return stream


async def abort_all(stream: trio.abc.AsyncResource | None) -> None:
    """Abort the transport under ``stream`` (RST / stream reset) so the peer sees a cut, not a clean end."""
    if stream is None:
        return
    with trio.CancelScope(shield=True):
        await abort_stream(innermost(stream))
        await trio.aclose_forcefully(stream)
