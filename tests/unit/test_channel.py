"""Channel framing: table of cases, round trips and a fuzz harness (any bytes decode or raise the protocol error)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.protocol.channel import (
    CLOSED,
    MAX_PAYLOAD,
    NEED_DATA,
    ChannelDecoder,
    ChannelProtocolError,
    Direction,
    Error,
    Event,
    Exit,
    FrameType,
    Lagged,
    Resize,
    Signal,
    Stderr,
    Stdin,
    StdinEof,
    Stdout,
    encode_frame,
)
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.exit_result import EndReason, ExitResult

# the §2.5 object exactly as a boundary writes it
RESULT_WIRE = (
    b'{"handle":"p_0123456789abcdef","exited":true,"code":null,"signal":"TERM","signal_number":15,'
    b'"rendered":143,"core_dumped":false,"reason":"terminated","ended_at":"2026-12-01T00:00:00.000Z"}'
)
RESULT = ExitResult(
    "p_0123456789abcdef", None, "TERM", 15, 143, False, EndReason.TERMINATED, "2026-12-01T00:00:00.000Z"
)


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BI", kind, len(payload)) + payload


def decode_all(data: bytes, direction: Direction | None = None) -> list[Any]:
    dec = ChannelDecoder(direction)
    dec.receive_data(data)
    dec.receive_data(b"")
    out: list[Any] = []
    while (ev := dec.next_frame()) is not CLOSED:
        assert ev is not NEED_DATA
        out.append(ev)
    return out


VALID = [
    (frame(1, b"abc"), Stdin(b"abc")),
    (frame(1, b""), Stdin(b"")),
    (frame(2, b""), StdinEof()),
    (frame(3, b"\x00\x50\x00\x18"), Resize(80, 24)),
    (frame(3, b"\xff\xff\x00\x01"), Resize(65535, 1)),
    (frame(4, b"TERM"), Signal("TERM")),
    (frame(10, b"\x00\xff"), Stdout(b"\x00\xff")),
    (frame(11, b"err"), Stderr(b"err")),
    (frame(12, RESULT_WIRE), Exit(RESULT)),
    (frame(13, b'{"kind":"failed","reason":"x"}'), Error(OpError(ErrorKind.FAILED, "x"))),
    (
        frame(13, b'{"kind":"failed","reason":"exec","stage":"execve","errno":2}'),
        Error(OpError(ErrorKind.FAILED, "exec", stage="execve", errno=2)),
    ),
    (frame(14, (5).to_bytes(8, "big")), Lagged(5)),
]


@pytest.mark.parametrize(("raw", "event"), VALID)
def test_decode_valid(raw: bytes, event: Event) -> None:
    assert decode_all(raw) == [event]
    assert encode_frame(event) == raw


INVALID = [
    (frame(0, b""), "unknown frame type"),
    (frame(5, b""), "unknown frame type"),
    (frame(255, b""), "unknown frame type"),
    (frame(2, b"x"), "no payload"),
    (frame(3, b"\x00\x50\x00"), "4 bytes"),
    (frame(3, b"\x00\x00\x00\x18"), "zero"),
    (frame(3, b"\x00\x50\x00\x00"), "zero"),
    (frame(4, b""), "signal name"),
    (frame(4, b"SIG TERM"), "signal name"),
    (frame(4, "TÉRM".encode()), "signal name"),
    (frame(4, b"T" * 33), "signal name"),
    (frame(12, b"[1]"), "JSON object"),
    (frame(12, b"\xff"), "not JSON"),
    (frame(12, b"{"), "not JSON"),
    (frame(12, b"[" * 100000), "not JSON"),
    (frame(13, b"null"), "JSON object"),
    (frame(12, b'{"code":"0"}'), "EXIT: exit result field code must be int"),
    (frame(12, b'{"code":true}'), "EXIT: exit result field code must be int"),
    (frame(12, b'{"reason":"bored"}'), "EXIT: exit result field reason"),
    (frame(12, b'{"signal":15}'), "EXIT: exit result field signal must be str"),
    (frame(14, b"\x00" * 7), "8 bytes"),
    (struct.pack(">BI", 1, MAX_PAYLOAD + 1), "exceeds"),
    (struct.pack(">BI", 1, 0xFFFFFFFF), "exceeds"),
    (frame(1, b"abc")[:-1], "ended inside a frame"),
    (b"\x01\x00", "ended inside a frame"),
]


@pytest.mark.parametrize(("raw", "message"), INVALID)
def test_decode_invalid(raw: bytes, message: str) -> None:
    with pytest.raises(ChannelProtocolError, match=message):
        decode_all(raw)


def test_oversize_length_rejected_before_payload_arrives() -> None:
    dec = ChannelDecoder()
    dec.receive_data(struct.pack(">BI", 10, MAX_PAYLOAD + 1))
    with pytest.raises(ChannelProtocolError):
        dec.next_frame()
    # once broken, always broken
    with pytest.raises(ChannelProtocolError):
        dec.next_frame()


def test_max_payload_accepted() -> None:
    data = b"x" * MAX_PAYLOAD
    assert decode_all(encode_frame(Stdout(data))) == [Stdout(data)]
    with pytest.raises(ValueError):
        encode_frame(Stdout(data + b"x"))


@pytest.mark.parametrize(
    ("direction", "raw"),
    [
        (Direction.TO_BOUNDARY, frame(12, b"{}")),  # a client forging an exit
        (Direction.TO_BOUNDARY, frame(10, b"x")),
        (Direction.TO_BOUNDARY, frame(14, bytes(8))),
        (Direction.TO_CLIENT, frame(1, b"x")),  # a boundary injecting stdin
        (Direction.TO_CLIENT, frame(3, b"\x00\x01\x00\x01")),
    ],
)
def test_direction_enforced(direction: Direction, raw: bytes) -> None:
    with pytest.raises(ChannelProtocolError, match="not allowed"):
        decode_all(raw, direction)


def test_byte_at_a_time_and_need_data() -> None:
    raw = b"".join(encode_frame(e) for _, e in VALID)
    dec = ChannelDecoder()
    out: list[Any] = []
    for i in range(len(raw)):
        dec.receive_data(raw[i : i + 1])
        while (ev := dec.next_frame()) is not NEED_DATA:
            out.append(ev)
    dec.receive_data(b"")
    assert dec.next_frame() is CLOSED
    assert out == [e for _, e in VALID]


def test_receive_after_eof_is_misuse() -> None:
    dec = ChannelDecoder()
    dec.receive_data(b"")
    with pytest.raises(RuntimeError):
        dec.receive_data(b"x")


@pytest.mark.parametrize(
    "event",
    [Resize(0, 1), Resize(1, 65536), Signal(""), Signal("A B"), Lagged(-1), Lagged(1 << 64)],
)
def test_encode_refuses_undecodable(event: Event) -> None:
    with pytest.raises(ValueError):
        encode_frame(event)


def test_frame_type_values_are_the_wire_codes() -> None:
    assert {t.name: t.value for t in FrameType} == {
        "STDIN": 1, "STDIN_EOF": 2, "RESIZE": 3, "SIGNAL": 4, "STDOUT": 10, "STDERR": 11,
        "EXIT": 12, "ERROR": 13, "LAGGED": 14,
    }  # fmt: skip


events = st.one_of(
    st.builds(Stdin, st.binary(max_size=300)),
    st.just(StdinEof()),
    st.builds(Resize, st.integers(1, 65535), st.integers(1, 65535)),
    st.builds(Signal, st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=32)),
    st.builds(Stdout, st.binary(max_size=300)),
    st.builds(Stderr, st.binary(max_size=300)),
    st.builds(
        Exit,
        st.builds(
            ExitResult,
            st.none() | st.text(max_size=20),
            st.none() | st.integers(),
            st.none() | st.text(max_size=8),
            st.none() | st.integers(),
            st.none() | st.integers(),
            st.booleans(),
            st.sampled_from(EndReason),
            st.none() | st.text(max_size=30),
            st.booleans(),
        ),
    ),
    st.builds(
        Error,
        st.builds(
            OpError,
            st.sampled_from(ErrorKind),
            st.text(max_size=20),
            st.none() | st.text(max_size=8),
            st.none() | st.text(max_size=8),
            st.none() | st.integers(),
        ),
    ),
    st.builds(Lagged, st.integers(0, (1 << 64) - 1)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=8), st.lists(st.integers(1, 50), max_size=20))
def test_round_trip(evs: list[Event], cuts: list[int]) -> None:
    raw = b"".join(encode_frame(e) for e in evs)
    dec = ChannelDecoder()
    out: list[Any] = []
    pos = 0
    for cut in [*cuts, len(raw)]:
        if chunk := raw[pos : pos + cut]:
            dec.receive_data(chunk)
        pos += cut
        while (ev := dec.next_frame()) is not NEED_DATA:
            out.append(ev)
        if pos >= len(raw):
            break
    dec.receive_data(b"")
    assert dec.next_frame() is CLOSED
    assert out == evs


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([None, Direction.TO_BOUNDARY, Direction.TO_CLIENT]))
def test_fuzz_any_bytes(data: bytes, direction: Direction | None) -> None:
    try:
        for ev in decode_all(data, direction):
            assert isinstance(ev, Stdin | StdinEof | Resize | Signal | Stdout | Stderr | Exit | Error | Lagged)
    except ChannelProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(FrameType)), st.binary(max_size=40))
def test_fuzz_typed_payloads(kind: FrameType, payload: bytes) -> None:
    try:
        (ev,) = decode_all(frame(kind, payload))
    except ChannelProtocolError:
        return
    assert encode_frame(ev) == frame(kind, payload) or kind in (FrameType.EXIT, FrameType.ERROR)
