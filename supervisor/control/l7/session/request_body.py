"""A request body read whole before it is forwarded: to decide it, or to sign it.

The agent's own protocols (JSON-RPC, MCP, GraphQL) are decided by their body, and a request signed by its
body's hash needs all of it; what was read is what is forwarded (``rec.body``), so the server executes exactly
what was judged and signed. Every other body streams (``upstream``).
"""

from __future__ import annotations

import hashlib

import h11

from supervisor.control.l7.body import BodyRequest, refused
from supervisor.control.l7.body_decide import evaluate
from supervisor.control.l7.record import RequestRecord
from supervisor.control.l7.session.state import AgentFailed, Session
from supervisor.control.l7.signing import Payload, Plan, signed_headers
from supervisor.control.policy import Decision, DenyReason
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.request_head import RequestHead


async def decide_body(s: Session, conn: h11.Connection, rec: RequestRecord, head: RequestHead, target: str,
                      pending: Decision) -> Decision:  # fmt: skip
    """The agent's own protocols (``body``): read the whole body, up to the endpoint's limit, and decide it. What
    was read is what is forwarded (``rec.body``), so the server executes exactly what was judged."""
    route = s.snapshot.body_route(s.l4, rec.method, target)
    if route is None:
        return pending
    if rec.expects_continue and conn.they_are_waiting_for_100_continue:
        await s.agent_send(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            s.malformed(rec, OutcomeReason.INVALID_BODY, str(exc)[:200])
        if event is h11.NEED_DATA:
            data = await s.agent_recv(None)
            if not data:
                raise AgentFailed("agent: request body ended or stalled")
            conn.receive_data(data)
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > route.limit:
                return refused(route, f"request body is over the endpoint's limit of {route.limit} bytes",
                               reason=DenyReason.BODY_TOO_LARGE)  # fmt: skip
        elif isinstance(event, h11.EndOfMessage):
            break
        else:
            raise AgentFailed(f"agent: connection ended inside the request ({type(event).__name__})")
    rec.body, rec.request_done = bytes(body), True
    content_type = head.values("content-type")
    media = content_type[0].split(";", 1)[0].strip().lower() if len(content_type) == 1 else None
    encoded = any(v.strip().lower() not in ("", "identity") for v in head.values("content-encoding"))
    decision = evaluate(route, BodyRequest(rec.method, route.query, media, encoded, rec.body))
    if decision.operation is not None:
        rec.extra["operation"] = decision.operation
    return decision


async def sign(s: Session, conn: h11.Connection, rec: RequestRecord, p: Plan, target: str,
               headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:  # fmt: skip
    """Sign the final request (``signing``): a body signed by its hash is read whole first (answering ``Expect:
    100-continue`` here, so the client sends it) and forwarded from ``rec.body``; one read whole already to decide
    it (``decide_body``) is hashed as it is."""
    payload_hash = hashlib.sha256(b"").hexdigest() if p.payload is Payload.HASHED else p.payload.value
    if p.payload is Payload.HASHED and rec.has_body:
        if rec.body is None:
            rec.body, rec.request_done = await _read_body_to_sign(s, conn, rec), True
        payload_hash = hashlib.sha256(rec.body).hexdigest()
    if rec.body is not None:  # its 100 Continue was answered here: the origin is not asked again
        headers = [(n, v) for n, v in headers if n.lower() != b"expect"]
    text = [(n.decode("utf-8"), v.decode("utf-8")) for n, v in headers]
    out = signed_headers(p, method=rec.method, target=target, headers=text, payload_hash=payload_hash)
    rec.credentials = (*rec.credentials, p.credential.name)
    rec.extra["signed"] = p.payload.value
    return [(n.encode("utf-8"), v.encode("utf-8")) for n, v in out]


async def _read_body_to_sign(s: Session, conn: h11.Connection, rec: RequestRecord) -> bytes:
    """The whole request body, at most its ``Content-Length`` (which ``plan`` bounded)."""
    if rec.expects_continue:
        await s.agent_send(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise AgentFailed(f"agent: malformed request body: {exc}") from None
        if event is h11.NEED_DATA:
            data = await s.agent_recv(None)
            if not data:
                raise AgentFailed("agent: request body ended or stalled before it was signed")
            conn.receive_data(data)
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        else:
            raise AgentFailed(f"agent: connection ended inside the request ({type(event).__name__})")
