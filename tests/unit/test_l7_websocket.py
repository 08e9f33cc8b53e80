"""The client-frame filter for denied WEBSOCKET_TEXT (RFC 6455 framing), byte-exact and streaming."""

from __future__ import annotations

import os
import struct

import pytest

from supervisor.control.l7.websocket import (
    MAX_MESSAGE,
    ClientFrameFilter,
    FilterStop,
    MessageFilter,
    client_close_frame,
    server_close_frame,
)


def frame(opcode: int, payload: bytes, *, fin: bool = True, masked: bool = True) -> bytes:
    head = bytearray([(0x80 if fin else 0) | opcode])
    length = len(payload)
    mask_bit = 0x80 if masked else 0
    if length < 126:
        head.append(mask_bit | length)
    elif length < 65536:
        head += bytes([mask_bit | 126]) + struct.pack("!H", length)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", length)
    if not masked:
        return bytes(head) + payload
    key = os.urandom(4)
    return bytes(head) + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


BINARY, TEXT, CONT, PING, CLOSE = 0x2, 0x1, 0x0, 0x9, 0x8


@pytest.mark.parametrize("step", [1, 3, 7, 1 << 20])
def test_binary_and_control_frames_pass_unchanged_in_any_split(step: int) -> None:
    stream = frame(BINARY, b"a" * 70000) + frame(PING, b"hi") + frame(BINARY, b"x", fin=False) + \
        frame(PING, b"") + frame(CONT, b"yz") + frame(CLOSE, struct.pack("!H", 1000))  # fmt: skip
    f = ClientFrameFilter()
    out = b"".join(f.feed(stream[i : i + step]) for i in range(0, len(stream), step))
    assert out == stream and f.stopped is None


@pytest.mark.parametrize("step", [1, 5, 4096])
def test_first_text_frame_stops_everything_before_its_header(step: int) -> None:
    allowed = frame(BINARY, b"ok") + frame(PING, b"p")
    stream = allowed + frame(TEXT, b"secret plan") + frame(BINARY, b"later")
    f = ClientFrameFilter()
    out = b"".join(f.feed(stream[i : i + step]) for i in range(0, len(stream), step))
    assert out == allowed and f.stopped is FilterStop.TEXT_DENIED
    assert f.feed(frame(BINARY, b"more")) == b""


def test_fragmented_text_is_stopped_at_its_first_fragment() -> None:
    f = ClientFrameFilter()
    assert f.feed(frame(TEXT, b"par", fin=False)) == b"" and f.stopped is FilterStop.TEXT_DENIED


@pytest.mark.parametrize("bad", [
    frame(BINARY, b"x", masked=False),  # clients must mask
    frame(0x3, b""),  # reserved opcode
    frame(PING, b"", fin=False),  # fragmented control frame
    frame(PING, b"p" * 126),  # oversized control frame
    frame(CONT, b"x"),  # continuation without a message
    frame(BINARY, b"x", fin=False) + frame(BINARY, b"y"),  # new message inside a fragmented one
])  # fmt: skip
def test_protocol_errors(bad: bytes) -> None:
    f = ClientFrameFilter()
    f.feed(bad)
    assert f.stopped is FilterStop.PROTOCOL_ERROR


def test_close_frames() -> None:
    assert server_close_frame(1008, "no") == b"\x88\x04\x03\xf0no"
    masked = client_close_frame(1008, "no")
    assert masked[:2] == b"\x88\x84"
    key = masked[2:6]
    assert bytes(b ^ key[i % 4] for i, b in enumerate(masked[6:])) == b"\x03\xf0no"
    assert ClientFrameFilter().feed(masked) == masked


@pytest.mark.parametrize("step", [1, 5, 1 << 20])
def test_message_filter_holds_each_message_until_whole_then_forwards_it_as_sent(step: int) -> None:
    """GraphQL over WebSocket: fragments reassembled and unmasked for the judge; control frames pass at once."""
    seen: list[bytes] = []
    first = frame(TEXT, b'{"type": "sub', fin=False)
    ping = frame(PING, b"p")
    rest = frame(CONT, b'scribe"}')
    binary = frame(BINARY, b"x" * 70000)
    stream = first + ping + rest + binary
    f = MessageFilter(lambda message: seen.append(message) or True)
    out = b"".join(f.feed(stream[i : i + step]) for i in range(0, len(stream), step))
    assert seen == [b'{"type": "subscribe"}', b"x" * 70000]
    assert out == ping + first + rest + binary
    assert f.stopped is None


def test_message_filter_refusals() -> None:
    denied = MessageFilter(lambda message: False)
    assert denied.feed(frame(TEXT, b"{}")) == b"" and denied.stopped is FilterStop.MESSAGE_DENIED
    compressed = MessageFilter(lambda message: True)
    data = bytearray(frame(TEXT, b"{}"))
    data[0] |= 0x40  # RSV1: permessage-deflate, never negotiated here
    assert compressed.feed(bytes(data)) == b"" and compressed.stopped is FilterStop.PROTOCOL_ERROR
    head = bytes([0x02, 0x80 | 127]) + struct.pack("!Q", MAX_MESSAGE + 1) + b"mask"
    big = MessageFilter(lambda message: True)
    assert big.feed(head) == b"" and big.stopped is FilterStop.MESSAGE_TOO_BIG
