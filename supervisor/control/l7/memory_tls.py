"""TLS on an ``ssl.SSLObject`` with memory BIOs over any trio stream: both TLS ends of an inspected connection.

**Toward the agent** (server side) the bytes reach control on an HTTP/2 stream of the link, not on a socket, so
OpenSSL cannot read and write the transport itself: records pass through memory BIOs. ``trio.SSLStream`` does the
same, but pays per call for what this path never needs (a lock and a conflict check per transport operation, one
record per receive, renegotiation support). **Toward the upstream** (client side) there is a socket, but OpenSSL
on it (``supervisor/link/socket_tls.py``) reads each record with two ``read`` calls (header, then body: no
read-ahead): a 64 KiB chunk of a download cost eight system calls, where one ``recv`` into the BIO serves it here.
``strace -c`` of one 64 MiB download: ~8,850 ``read`` calls upstream with OpenSSL on the socket, 1,051 here. Here:

* a receive feeds the transport's bytes into the incoming BIO and reads every record already decryptable, up to
  ``max_bytes``, in one call (one record: no join, no copy);
* a send encrypts all it is given at once and hands the transport what the outgoing BIO holds in one
  ``send_all``.

Rules:

1. :meth:`MemoryTLSStream.do_handshake` before anything else. A write never waits for a read: the agent-side
   leaf refuses renegotiation (``supervisor/control/l7/ca.py`` rule 3), and an upstream asking for one mid-write
   breaks the stream (TLS 1.3 has none).
2. Ciphertext leaves in the outgoing BIO's order: whoever flushes it (a send, a receive that produced a
   post-handshake message, the handshake, ``aclose``) holds :attr:`_flushing` while reading and sending, and
   sends until it is empty, so two flushes never interleave and a send returns only once its records are out.
3. Errors follow ``trio.abc.Stream`` and ``trio.SSLStream``: a TLS failure (an alert, a certificate that fails
   verification, a bad record, a cut handshake) is ``trio.BrokenResourceError`` whose ``__cause__`` is the
   ``ssl.SSLError``; the peer's close_notify and a transport EOF without one (``https_compatible``: HTTPS peers do
   that) are ``b""``; use after ``aclose`` is ``trio.ClosedResourceError``, and every call after a failure
   ``BrokenResourceError``.
4. ``aclose`` sends close_notify when it can (never waits for the peer's) and closes the transport.
"""

from __future__ import annotations

import ssl

import trio

__all__ = ["MemoryTLSStream"]

READ_SIZE = 256 * 1024  # the largest transport read, and a receive without max_bytes: session.Limits.chunk
# ``socket.recv(n)`` allocates all n bytes before it shrinks the result: on loopback TCP a 256 KiB recv of a small
# request costs ~25 us more than a 64 KiB one. So the transport read starts at SMALL_READ and grows to READ_SIZE
# only while reads fill it (a bulk transfer), and falls back once one returns less than SMALL_READ.
SMALL_READ = 64 * 1024


class _OneAtATime:
    def __init__(self, what: str) -> None:
        self._what = what
        self._busy = False

    def __enter__(self) -> None:
        if self._busy:
            raise trio.BusyResourceError(f"another task is {self._what} on this TLS stream")
        self._busy = True

    def __exit__(self, *_exc: object) -> None:
        self._busy = False


class MemoryTLSStream(trio.abc.Stream):
    """TLS over any trio stream (``transport_stream``, which it owns); a client when given ``server_hostname``."""

    def __init__(
        self, transport: trio.abc.Stream, ctx: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None
    ) -> None:
        self.transport_stream = transport
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self._flushing = trio.Lock()
        self._sending = _OneAtATime("sending")
        self._receiving = _OneAtATime("receiving")
        self._read_size = SMALL_READ  # the next transport read: doubled while reads fill it, up to READ_SIZE
        self._closed = False
        self._broken = False  # a TLS failure was reported: every later call reports it again

    def selected_alpn_protocol(self) -> str | None:
        return self._tls.selected_alpn_protocol()

    def version(self) -> str | None:
        return self._tls.version()

    async def do_handshake(self) -> None:
        with self._receiving:
            while True:
                self._check_open()
                try:
                    self._tls.do_handshake()
                except ssl.SSLWantReadError:
                    await self._flush()
                    await self._feed()
                    continue
                except ssl.SSLError as exc:
                    self._broken = True
                    await self._flush_quietly()  # the alert that says why, as trio.SSLStream sends it
                    raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
                break
            await self._flush()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        with self._receiving:
            size = READ_SIZE if max_bytes is None else max_bytes
            if size < 1:
                raise ValueError("max_bytes must be at least 1")
            await trio.lowlevel.checkpoint_if_cancelled()
            waited = False
            pieces: list[bytes] = []
            got = 0
            while True:
                self._check_open()
                try:
                    piece = self._tls.read(size - got)
                except ssl.SSLWantReadError:
                    if got:
                        break
                    if self._outgoing.pending:
                        await self._flush()
                    await self._feed()
                    waited = True
                    continue
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    break  # close_notify, or the transport's end without one (rule 3): the end of data
                except ssl.SSLError as exc:
                    if got:
                        break  # hand over what arrived; the next receive reports the failure
                    self._broken = True
                    raise trio.BrokenResourceError(f"TLS receive failed: {exc}") from exc
                if not piece:
                    break
                pieces.append(piece)
                got += len(piece)
                if got >= size or not self._incoming.pending:
                    break  # what is buffered in OpenSSL itself is read by the next call without waiting
            if self._outgoing.pending:  # a post-handshake message (a key update's answer)
                await self._flush()
                waited = True
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._sending:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._check_open()
            if not data:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
            try:
                self._tls.write(data)
            except ssl.SSLError as exc:  # SSLWantReadError included: a renegotiation (rule 1)
                self._broken = True
                raise trio.BrokenResourceError(f"TLS send failed: {exc}") from exc
            await self._flush()

    async def wait_send_all_might_not_block(self) -> None:
        self._check_open()
        await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        try:
            try:
                if not self._broken:
                    self._tls.unwrap()  # our close_notify into the outgoing BIO; the peer's is not awaited
            except ssl.SSLError:
                pass
            if not self._broken and not self._flushing.locked():
                await self._flush_quietly()
        finally:
            self._closed = True
            await self.transport_stream.aclose()

    # -- helpers -----------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream was closed")
        if self._broken:
            raise trio.BrokenResourceError("the TLS stream failed earlier")

    async def _feed(self) -> None:
        data = await self.transport_stream.receive_some(self._read_size)
        if len(data) >= self._read_size:
            self._read_size = min(self._read_size * 2, READ_SIZE)
        elif len(data) < SMALL_READ:
            self._read_size = SMALL_READ
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()

    async def _flush(self) -> None:
        if self._flushing.locked():
            await self._flushing.acquire()
        else:
            self._flushing.acquire_nowait()  # the common case: no other flush, no extra schedule point
        try:
            while self._outgoing.pending:
                await self.transport_stream.send_all(self._outgoing.read())
        finally:
            self._flushing.release()

    async def _flush_quietly(self) -> None:
        try:
            await self._flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
