"""Every place the link reaches into h2, hpack or hyperframe below their public API, in one module.

The link's CPU budget goes to the TLS leg and h2's pure-Python framing; three hooks trim the second. Each relies
on a private name of a pinned dependency (``pyproject.toml`` pins the versions
``tests/unit/test_link_h2_hooks.py`` checks: that test names each hook and fails saying which one moved):

1. hyperframe's ``DataFrame._body_repr`` is replaced by a length-only repr (:func:`install`, once at import).
2. hpack's ``Encoder.encode(headers, huffman=True)`` is called with ``huffman=False`` (:class:`PlainEncoder`).
3. h2's ``H2Connection._prepare_for_sending(frames)``, the one funnel every outgoing frame passes through, and
   its output buffer ``_data_to_send`` (a ``bytearray``) are overridden by :class:`H2Connection`, which keeps
   large DATA payloads out of that buffer.
"""

from __future__ import annotations

import struct
from typing import Any

import h2.config
import h2.connection
import h2.exceptions
import hpack
import hyperframe.frame

__all__ = ["FRAME_HEADER", "H2Connection", "PlainEncoder", "install"]

FRAME_HEADER = struct.Struct(">HBBBL")  # RFC 9113 §4.1: length (24 bits), type, flags, stream id
DIRECT_DATA_MIN = 4096  # DATA payloads at least this large skip h2's output buffer


def _data_repr(frame: hyperframe.frame.DataFrame) -> str:
    return f"<{len(frame.data)} bytes>"


def install() -> None:
    """h2 logs ``repr(frame)`` for every received frame even with its dummy logger, and hyperframe's DATA frame
    repr re-serialises and hex-encodes the whole payload before truncating it: 20 % of a bulk transfer's CPU in
    the profile. The repr is only ever for debugging, so the DATA one is made cheap (length only)."""
    hyperframe.frame.DataFrame._body_repr = _data_repr  # type: ignore[method-assign,assignment]


install()


class PlainEncoder(hpack.Encoder):
    """HPACK without Huffman coding. Both ends of a link are ours and a link's headers are a few dozen bytes, while
    hpack codes each literal bit by bit in Python, both ways: about a fifth of h2's cost per exchange (a stream's
    request and reply). Indexing is unchanged."""

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        return super().encode(headers, huffman=False)


class H2Connection(h2.connection.H2Connection):
    """h2's connection with DATA frames kept out of its output buffer.

    h2 serialises every outgoing frame into one ``bytearray`` and ``data_to_send()`` copies it out: a DATA frame's
    payload is copied four times (body join, header + body, the frames' join, the buffer) before TLS reads it, a
    fifth of a bulk transfer's CPU on the sending side. Here a DATA frame without padding is queued as its 9-byte
    header and the payload object itself; everything else still goes through h2's serialisation, in order.
    h2's state machine, flow control and frame-size checks are untouched (they run before this hook).
    """

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config=config)
        self.encoder = PlainEncoder()  # before any SETTINGS: h2 sizes its table from them later
        self._chunks: list[bytes] = []

    def _prepare_for_sending(self, frames: list[Any]) -> None:
        for frame in frames:
            if (
                isinstance(frame, hyperframe.frame.DataFrame)
                and not frame.pad_length
                and len(frame.data) >= DIRECT_DATA_MIN
            ):
                if frame.body_len > self.max_outbound_frame_size:  # h2 checked it already; keep its invariant
                    raise h2.exceptions.FrameTooLargeError(f"DATA frame of {len(frame.data)} bytes")
                if self._data_to_send:
                    self._chunks.append(bytes(self._data_to_send))
                    self._data_to_send = bytearray()
                flags = 0x1 if "END_STREAM" in frame.flags else 0
                size = len(frame.data)
                self._chunks.append(FRAME_HEADER.pack(size >> 8, size & 0xFF, 0x0, flags, frame.stream_id))
                self._chunks.append(frame.data)
            else:
                super()._prepare_for_sending([frame])

    @property
    def has_output(self) -> bool:
        """Whether anything waits to be written."""
        return bool(self._chunks or self._data_to_send)

    @property
    def output_size(self) -> int:
        return sum(map(len, self._chunks)) + len(self._data_to_send)

    def chunks_to_send(self) -> list[bytes]:
        """Everything to write, in order, as a list of buffers (``data_to_send()`` for this subclass)."""
        chunks = self._chunks
        self._chunks = []
        if self._data_to_send:
            chunks.append(bytes(self._data_to_send))
            self._data_to_send = bytearray()
        return chunks
