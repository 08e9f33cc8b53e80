"""Raw head validation: every smuggling shape h11 would tolerate is refused here, by name."""

from __future__ import annotations

import pytest

from supervisor.protocol.request_head import MAX_HEAD_BYTES, HeadError, HeadProblem, check_head, find_head_end

OK = b"GET /a?b=1 HTTP/1.1\r\nHost: api.test\r\nAccept: */*\r\n\r\n"

REFUSED = [
    (b"GET / HTTP/1.1\nHost: a\n\n", HeadProblem.BARE_LF),
    (b"GET / HTTP/1.1\r\nHost: a\nX: 1\r\n\r\n", HeadProblem.BARE_LF),
    (b"GET / HTTP/1.1\r\nHost: a\rX: 1\r\n\r\n", HeadProblem.BARE_CR),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n folded\r\n\r\n", HeadProblem.OBS_FOLD),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\tfolded\r\n\r\n", HeadProblem.OBS_FOLD),
    (b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", HeadProblem.REQUEST_LINE),
    (b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", HeadProblem.REQUEST_LINE),
    (b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", HeadProblem.REQUEST_LINE),
    (b"GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n", HeadProblem.REQUEST_LINE),
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", HeadProblem.VERSION),
    (b"GET / HTTP/0.9\r\nHost: a\r\n\r\n", HeadProblem.VERSION),
    (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", HeadProblem.HEADER_LINE),
    (b"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", HeadProblem.HEADER_LINE),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", HeadProblem.HEADER_VALUE),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x0bb\r\n\r\n", HeadProblem.HEADER_VALUE),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: \xff\xfe\r\n\r\n", HeadProblem.HEADER_VALUE),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", HeadProblem.CONTENT_LENGTH),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", HeadProblem.CONTENT_LENGTH),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n", HeadProblem.CONTENT_LENGTH),
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        HeadProblem.CONTENT_LENGTH_CONFLICT,
    ),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", HeadProblem.TRANSFER_ENCODING),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", HeadProblem.TRANSFER_ENCODING),
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        HeadProblem.TRANSFER_ENCODING,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        HeadProblem.LENGTH_AND_CHUNKED,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        HeadProblem.LENGTH_AND_CHUNKED,
    ),
    (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", HeadProblem.CHUNKED_ON_HTTP10),
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", HeadProblem.DUPLICATE_HOST),
    (b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n", HeadProblem.DUPLICATE_HOST),
    (b"GET / HTTP/1.1\r\n\r\n", HeadProblem.MISSING_HOST),
    (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close, content-length\r\n\r\n", HeadProblem.CONNECTION_TOKEN),
    (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Transfer-Encoding\r\n\r\n", HeadProblem.CONNECTION_TOKEN),
    (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Host\r\n\r\n", HeadProblem.CONNECTION_TOKEN),
    (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: a b\r\n\r\n", HeadProblem.CONNECTION_TOKEN),
]


@pytest.mark.parametrize(("raw", "problem"), REFUSED)
def test_refused_heads_name_their_problem(raw: bytes, problem: HeadProblem) -> None:
    with pytest.raises(HeadError) as caught:
        end = find_head_end(raw)
        check_head(raw if end is None else raw[:end])
    assert caught.value.problem is problem


def test_a_valid_head() -> None:
    head = check_head(OK)
    assert (head.method, head.target, head.version, head.host) == ("GET", "/a?b=1", "1.1", "api.test")
    assert head.content_length is None and not head.chunked
    assert head.values("accept") == ["*/*"]


def test_framing_is_reported() -> None:
    assert check_head(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nContent-Length: 12\r\n\r\n"
                      ).content_length == 12  # fmt: skip
    assert check_head(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n").chunked


def test_http10_may_omit_host_and_tokens_are_lowered() -> None:
    head = check_head(b"GET / HTTP/1.0\r\nConnection: Keep-Alive, Upgrade\r\n\r\n")
    assert head.host is None and head.tokens("connection") == {"keep-alive", "upgrade"}


def test_find_head_end_waits_then_finds_the_first_terminator() -> None:
    assert find_head_end(b"GET / HTTP/1.1\r\nHost: a\r\n") is None
    assert find_head_end(b"GET / HTTP/1.1\r\nHost: a\r") is None  # a CR at the edge may still get its LF
    assert find_head_end(OK + b"GET /next") == len(OK)


def test_bare_lf_is_refused_before_any_terminator_arrives() -> None:
    with pytest.raises(HeadError) as caught:
        find_head_end(b"GET / HTTP/1.1\nHost: a\n")
    assert caught.value.problem is HeadProblem.BARE_LF


def test_head_size_bound() -> None:
    big = b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"a" * MAX_HEAD_BYTES
    with pytest.raises(HeadError) as caught:
        find_head_end(big)
    assert caught.value.problem is HeadProblem.TOO_LARGE
    limit = b"GET / HTTP/1.1\r\nHost: a\r\nX: "
    exact = limit + b"a" * (MAX_HEAD_BYTES - len(limit) - 4) + b"\r\n\r\n"
    assert find_head_end(exact) == MAX_HEAD_BYTES
    with pytest.raises(HeadError):
        find_head_end(exact[:-4] + b"a\r\n\r\n")
