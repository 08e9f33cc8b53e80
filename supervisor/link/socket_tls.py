"""TLS on the socket itself: a non-blocking ``ssl.SSLSocket`` driven by trio's ``wait_readable``/``wait_writable``.

trio's ``SSLStream`` runs OpenSSL through memory BIOs: every record crosses Python twice (socket → BIO → SSL
object, and back), which held the egress link to a fraction of what OpenSSL does on a socket. Here OpenSSL reads
and writes the socket directly; Python is entered once per call, and a receive drains every record already
available into one buffer.

Memory BIOs of our own (``supervisor/control/l7/memory_tls.py``, one ``recv`` for many records where OpenSSL
here reads each record's header and body with a ``read`` each) were measured on the link: no less
CPU per small exchange and 8-10 % more per MB in bulk (each byte is copied into and out of two BIOs), with
``bench/bench_link.py`` — so the link keeps OpenSSL on the socket, and saves system calls by writing less often
(``h2link.py``: one write per wake-up of its writer, small frames packed into one record).

Rules:

1. The trio socket is detached into a standard-library socket wrapped by the context; the caller never touches
   the TCP stream again. ``TCP_NODELAY`` (set by trio) is a property of the descriptor and stays.
2. Every operation is an ``SSL_*`` call retried after ``wait_readable``/``wait_writable`` on ``SSLWantRead``/
   ``SSLWantWrite`` (either can be asked by either call: a TLS 1.3 key update or a session ticket).
3. A failed handshake leaves the alert OpenSSL wrote already on the wire (there is no buffer in between); the
   failure is :class:`ssl.SSLError` (the certificate checks) or :class:`trio.BrokenResourceError`.
4. Errors follow ``trio.abc.Stream``: a reset or a TLS error is ``BrokenResourceError`` (the cause kept), use
   after ``aclose`` is ``ClosedResourceError``; the peer's close_notify or a TCP end is ``b""``.
5. ``send_all`` writes in chunks and retries a chunk that would block with the same bytes (OpenSSL requires it;
   CPython sets ``SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER``). One task sends and one receives at a time (trio's
   conflict detection), and the two may interleave freely: OpenSSL allows reads between a blocked write's retries.
   ``send_many`` sends several buffers as if joined, without joining them: each is one ``SSL_write`` (so a record
   ends where a buffer ends, and a buffer of up to 16 KiB is one record and one ``write``); the link's writer
   packs what it has into such buffers (``h2link._pack``).
6. ``aclose`` sends close_notify when the socket takes it at once (never waits for the peer's), wakes any task
   waiting on the socket, and closes it; ``reset`` closes with a TCP reset and nothing else.
7. A receive decrypts into one buffer kept for the stream's life (allocated at the first receive): a fresh
   zero-filled 256 KiB per receive cost more than the small messages most receives carry.
8. Each call is one schedule point, not two: a call that waited for the socket does not yield again before it
   returns (the link's reader woke, read and then went once more round trio's run loop for every record burst).
9. ``try_send`` writes from synchronous code, without waiting and without a schedule point (the link's write of
   a message on a quiet link, from its sender). If the socket fills mid-record, OpenSSL holds the record and must
   be handed the same bytes again: the stream keeps them and the next send finishes them first (the caller sees
   ``False`` and must make sure a send follows; ``send_all(b"")`` is enough).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from collections.abc import Sequence
from typing import Literal

import trio

READ_SIZE = 256 * 1024  # a receive's default size: h2link's frames are up to 256 KiB
SEND_CHUNK = 256 * 1024


class _OneAtATime:
    """``with`` it around an operation that two tasks must not run at once (``trio.BusyResourceError``)."""

    def __init__(self, message: str) -> None:
        self._message = message
        self._busy = False

    def __enter__(self) -> None:
        if self._busy:
            raise trio.BusyResourceError(self._message)
        self._busy = True

    def __exit__(self, *_exc: object) -> None:
        self._busy = False


class SocketTLSStream(trio.abc.Stream):
    """A ``trio.abc.Stream`` of TLS over a non-blocking socket; ``do_handshake`` before anything else."""

    def __init__(
        self,
        transport: trio.SocketStream,
        ctx: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        https_compatible: bool = False,
    ) -> None:
        """``https_compatible``: a TCP end without close_notify is an end of data (HTTPS servers do that; trio's
        flag of the same name), else it is a broken stream (our own links always send close_notify)."""
        raw = socket.socket(fileno=transport.socket.detach())
        raw.setblocking(False)
        self._ssl = ctx.wrap_socket(
            raw,
            server_side=server_side,
            server_hostname=server_hostname,
            do_handshake_on_connect=False,
            suppress_ragged_eofs=https_compatible,
        )
        self._closed = False
        self._buffer: bytearray | None = None  # rule 7
        self._send_conflict = _OneAtATime("another task is sending on this TLS stream")
        self._unfinished: bytes | None = None  # rule 9
        self._receive_conflict = _OneAtATime("another task is receiving on this TLS stream")

    # -- what verify_peer reads (supervisor.protocol.tls.TLSConnection) ----------------------------------------
    def version(self) -> str | None:
        return self._ssl.version()

    def selected_alpn_protocol(self) -> str | None:
        return self._ssl.selected_alpn_protocol()

    def getpeercert(self, binary_form: Literal[True]) -> bytes | None:
        return self._ssl.getpeercert(binary_form=binary_form)

    @property
    def socket(self) -> ssl.SSLSocket:
        return self._ssl

    # -- the stream --------------------------------------------------------------------------------------------
    async def do_handshake(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            self._check_open()
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                await self._wait(readable=True)
            except ssl.SSLWantWriteError:
                await self._wait(readable=False)
            except ssl.SSLError:
                raise  # the certificate checks and protocol failures: OpenSSL already sent its alert
            except OSError as exc:
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
            else:
                break
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        with self._receive_conflict:
            size = READ_SIZE if max_bytes is None else max_bytes
            if size < 1:
                raise ValueError("max_bytes must be at least 1")
            await trio.lowlevel.checkpoint_if_cancelled()
            if size <= READ_SIZE:
                if self._buffer is None:
                    self._buffer = bytearray(READ_SIZE)
                buffer = self._buffer
            else:
                buffer = bytearray(size)
            view = memoryview(buffer)[:size]
            got = 0
            waited = False
            while True:
                self._check_open()
                try:
                    n = self._ssl.recv_into(view[got:])
                except ssl.SSLWantReadError:
                    if got:
                        break
                    await self._wait(readable=True)
                    waited = True
                    continue
                except ssl.SSLWantWriteError:
                    if got:
                        break
                    await self._wait(readable=False)
                    waited = True
                    continue
                except ssl.SSLZeroReturnError:
                    break
                except (ssl.SSLError, OSError) as exc:
                    if got:
                        break  # hand over what arrived; the next receive reports the failure
                    raise trio.BrokenResourceError(f"TLS receive failed: {exc}") from exc
                if n == 0:
                    break  # TCP end without close_notify (suppress_ragged_eofs) or a zero-length record
                got += n
                if got == size:
                    break
            # One copy, through the view: slicing the bytearray itself would copy twice (and allocate twice).
            data = bytes(view[:got])
            view.release()
            if not waited:  # a wait was this call's schedule point already (rule 8)
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._send_conflict:
            await trio.lowlevel.checkpoint_if_cancelled()
            if not await self._send(data):
                await trio.lowlevel.cancel_shielded_checkpoint()

    async def send_many(self, pieces: Sequence[bytes | bytearray | memoryview]) -> None:
        """``send_all`` of the pieces joined, one ``SSL_write`` per piece (rule 5)."""
        with self._send_conflict:
            await trio.lowlevel.checkpoint_if_cancelled()
            waited = False
            for piece in pieces:
                waited = await self._send(piece) or waited
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()

    def try_send(self, data: bytes) -> bool:
        """Rule 9: ``True`` when ``data`` went whole now; ``False`` when the socket filled (kept for the next send).
        Raises ``BusyResourceError`` during another send, ``BrokenResourceError``/``ClosedResourceError`` as a send."""
        with self._send_conflict:
            self._check_open()
            if self._unfinished is not None:
                raise trio.BusyResourceError("a record is still being written")
            try:
                sent = self._ssl.send(data)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                sent = 0
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(f"TLS send failed: {exc}") from exc
            if sent < len(data):
                self._unfinished = data[sent:]
                return False
            return True

    async def _send(self, data: bytes | bytearray | memoryview) -> bool:
        """Write ``data`` whole, after what ``try_send`` left unfinished; whether it had to wait for the socket."""
        waited = False
        if self._unfinished is not None:
            waited = await self._write(self._unfinished)
            self._unfinished = None
        return await self._write(data) or waited

    async def _write(self, data: bytes | bytearray | memoryview) -> bool:
        waited = False
        with memoryview(data) as view, view.cast("B") as flat:
            sent = 0
            while sent < len(flat):
                self._check_open()
                chunk = flat[sent : sent + SEND_CHUNK]
                try:
                    sent += self._ssl.send(chunk)
                except ssl.SSLWantWriteError:
                    await self._wait(readable=False)
                    waited = True
                except ssl.SSLWantReadError:
                    await self._wait(readable=True)
                    waited = True
                except (ssl.SSLError, OSError) as exc:
                    raise trio.BrokenResourceError(f"TLS send failed: {exc}") from exc
        return waited

    async def wait_send_all_might_not_block(self) -> None:
        with self._send_conflict:
            self._check_open()
            await self._wait(readable=False)

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            self._ssl.unwrap()  # our close_notify; the peer's is never awaited
        except (ssl.SSLError, OSError, ValueError):
            pass
        trio.lowlevel.notify_closing(self._ssl)
        self._ssl.close()
        await trio.lowlevel.checkpoint()

    async def reset(self) -> None:
        """Abort: close the TCP connection with a reset and no close_notify (``relay.abort_stream`` calls it)."""
        if not self._closed:
            with contextlib.suppress(OSError):
                self._ssl.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await self.close_transport()

    async def close_transport(self) -> None:
        """Close the TCP connection under the session, sending nothing (no close_notify): a peer's hang-up."""
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self._ssl)
            socket.socket.close(self._ssl)  # the descriptor itself; SSLSocket.close would not add an alert either
        await trio.lowlevel.checkpoint()

    # -- helpers -----------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream was closed")

    async def _wait(self, *, readable: bool) -> None:
        try:
            if readable:
                await trio.lowlevel.wait_readable(self._ssl)
            else:
                await trio.lowlevel.wait_writable(self._ssl)
        except trio.ClosedResourceError:
            raise trio.ClosedResourceError("the TLS stream was closed") from None
