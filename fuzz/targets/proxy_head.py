"""The agent-facing proxy's head parser (``supervisor.protocol.proxy_head.parse_head``) and its body relay.

Oracles beyond "no crash":

* the answer is one of ``None`` (read more), a :class:`ProxyTarget` or a :class:`ProxyReject` that renders;
* a head it accepts was never refused early: every proper prefix of the accepted head is "read more";
* a forward request's rewritten origin-form head is one request h11 accepts, with exactly one ``Host`` (the
  target's authority) and no ``Proxy-Authorization``;
* :class:`ForwardBody` passes a body or raises ``ValueError``, and what it passes is a well-framed body.
"""

from __future__ import annotations

import h11

from supervisor.protocol.egress import CaptureKind
from supervisor.protocol.proxy_head import ProxyReject, ProxyTarget, parse_head


def _check_origin_head(target: ProxyTarget) -> None:
    assert target.request_head is not None
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(target.request_head)
    event = conn.next_event()
    assert isinstance(event, h11.Request), event
    names = [name.lower() for name, _ in event.headers.raw_items()]
    assert names.count(b"host") == 1, names
    assert b"proxy-authorization" not in names
    host = dict((n.lower(), v) for n, v in event.headers.raw_items())[b"host"].decode()
    shown = f"[{target.host}]" if ":" in target.host else target.host
    assert host == (shown if target.port == 80 else f"{shown}:{target.port}"), (host, target)


def _check_body(target: ProxyTarget) -> None:
    body = target.body()
    try:
        out = body.feed(target.leftover)
    except ValueError:
        return
    if not body.done:
        return
    framing = b"Transfer-Encoding: chunked" if target.chunked else b"Content-Length: %d" % len(out)
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"POST / HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n\r\n" + out)
    assert isinstance(conn.next_event(), h11.Request)
    while True:
        event = conn.next_event()
        if isinstance(event, h11.EndOfMessage):
            break
        assert isinstance(event, h11.Data), event


def one_input(data: bytes) -> None:
    result = parse_head(data)
    if result is None:
        return
    if isinstance(result, ProxyReject):
        assert result.render().startswith(b"HTTP/1.1 ")
        return
    assert isinstance(result, ProxyTarget), result
    result.describe()
    head_len = len(data) - len(result.leftover)
    for cut in {1, head_len // 2, head_len - 1}:
        if 0 < cut < head_len:
            assert parse_head(data[:cut]) is None, (cut, parse_head(data[:cut]))
    if result.kind is CaptureKind.HTTP_FORWARD:
        _check_origin_head(result)
        _check_body(result)
    else:
        assert result.request_head is None
