"""One request on the inspected path: the strict head reader (``protocol.request_head``) and h11's framing of the body.

Oracles beyond "no crash":

* ``find_head_end`` and ``check_head`` answer or raise ``HeadError``, nothing else;
* the head reader refuses what h11 refuses, and on a head both accept they agree on method, target, version and
  every header (the session parses each accepted head with h11 again);
* a body h11 reads from the agent, re-framed as the session writes it upstream, reads back as the same bytes.
"""

from __future__ import annotations

import h11

from supervisor.protocol.request_head import MAX_HEAD_BYTES, HeadError, RequestHead, check_head, find_head_end


def _agree(head: RequestHead, event: h11.Request) -> None:
    assert event.method.decode() == head.method
    assert event.target.decode() == head.target
    assert event.http_version.decode() == head.version
    # h11 folds repeated equal Content-Length headers into one and lower-cases Transfer-Encoding; the head reader
    # keeps them as sent (all equal; exactly "chunked" in any case)
    ours = [(n.lower(), v.lower() if n.lower() == "transfer-encoding" else v) for n, v in head.headers
            if n.lower() != "content-length"]  # fmt: skip
    theirs = [(n.lower().decode(), v.decode()) for n, v in event.headers.raw_items() if n.lower() != b"content-length"]
    assert ours == theirs, (ours, theirs)
    lengths = {int(v) for n, v in event.headers.raw_items() if n.lower() == b"content-length"}
    assert lengths == ({head.content_length} if head.content_length is not None else set()), (lengths, head)


def _body(conn: h11.Connection) -> None:
    """Read the body as the session does, re-frame it as its upstream connection does, read it back."""
    up = h11.Connection(h11.CLIENT)
    request = h11.Request(method=b"POST", target=b"/", headers=[(b"host", b"x"), (b"transfer-encoding", b"chunked")])
    wire = bytearray(up.send(request) or b"")
    received = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return
        if event is h11.NEED_DATA or event is h11.PAUSED:
            return
        if isinstance(event, h11.Data):
            received += event.data
            wire += up.send(h11.Data(data=event.data)) or b""
        elif isinstance(event, h11.EndOfMessage):
            wire += up.send(h11.EndOfMessage()) or b""
            break
    server = h11.Connection(h11.SERVER)
    server.receive_data(bytes(wire))
    assert isinstance(server.next_event(), h11.Request)
    echoed = bytearray()
    while True:
        event = server.next_event()
        if isinstance(event, h11.EndOfMessage):
            break
        assert isinstance(event, h11.Data), event
        echoed += event.data
    assert echoed == received


def one_input(data: bytes) -> None:
    try:
        end = find_head_end(data)
    except HeadError:
        return
    if end is None:
        return
    raw = data[:end]
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES + 1)
    conn.receive_data(data)
    try:
        event = conn.next_event()
        h11_error = None
    except h11.RemoteProtocolError as exc:
        event, h11_error = None, exc
    try:
        head = check_head(raw)
    except HeadError:
        return
    assert h11_error is None, f"h11 refuses what the head reader accepts: {h11_error}"
    assert isinstance(event, h11.Request), event
    _agree(head, event)
    _body(conn)
