"""The shared head reader as a state machine: fed in any pieces it gives the same answer, keeps what follows a
head for the next one, and refuses a hopeless prefix without waiting for more."""

from __future__ import annotations

import pytest

from supervisor.protocol.request_head import NEED_DATA, HeadError, HeadProblem, HeadReader, RequestHead

GOOD = b"POST /a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\nabc"
FRAMING = [
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\n",
        HeadProblem.CONTENT_LENGTH_CONFLICT,
    ),
    (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", HeadProblem.CHUNKED_ON_HTTP10),
]


def feed(data: bytes, step: int) -> RequestHead | HeadProblem:
    reader = HeadReader()
    for i in range(0, len(data), step):
        reader.receive_data(data[i : i + step])
        try:
            event = reader.next_event()
        except HeadError as exc:
            return exc.problem
        if isinstance(event, RequestHead):
            return event
    raise AssertionError("no event")


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_pieces_do_not_change_the_answer(step: int) -> None:
    head = feed(GOOD, step)
    assert isinstance(head, RequestHead) and head.content_length == 3 and head.raw == GOOD[:-3]
    for raw, problem in FRAMING:
        assert feed(raw, step) is problem


def test_keep_alive_heads_and_trailing_bytes() -> None:
    reader = HeadReader()
    reader.receive_data(GOOD[:-3] + b"GET /b HTTP/1.1\r\nHost: a.test\r\n\r\ntail")
    first, second = reader.next_event(), reader.next_event()
    assert isinstance(first, RequestHead) and isinstance(second, RequestHead)
    assert (first.target, second.target) == ("/a", "/b")
    assert reader.next_event() is NEED_DATA and reader.trailing_data() == b"tail" and reader.buffered == 0


@pytest.mark.parametrize(
    ("partial", "problem"),
    [
        (b"\x16\x03\x01\x02\x00", HeadProblem.REQUEST_LINE),  # a TLS ClientHello
        (b"GET / HTTP/1.1\nHost", HeadProblem.BARE_LF),
        (b"GET / HTTP/1.1\r\nHost: a\rX", HeadProblem.BARE_CR),
        (b"GET /\x00", HeadProblem.REQUEST_LINE),
        (b"GET / HTTP/1.1\r\nX: a\x01", HeadProblem.HEADER_VALUE),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"a" * 9000, HeadProblem.TOO_LARGE),
    ],
)
def test_a_hopeless_prefix_is_refused_at_once(partial: bytes, problem: HeadProblem) -> None:
    reader = HeadReader(8192)
    reader.receive_data(partial)
    with pytest.raises(HeadError) as caught:
        reader.next_event()
    assert caught.value.problem is problem


def test_a_cr_at_the_edge_waits_for_its_lf() -> None:
    reader = HeadReader()
    reader.receive_data(b"GET / HTTP/1.1\r")
    assert reader.next_event() is NEED_DATA and reader.received
    reader.receive_data(b"\nHost: a\r\n\r\n")
    assert isinstance(reader.next_event(), RequestHead)
