"""The upstream's response relayed to the agent through both h11 state machines, scrubbed on the way.

From a host a credential is bound to, the secret echoed anywhere in the answer becomes its placeholder
(``scrub``); an answer that cannot be scrubbed (the secret in a header name, a ``206``, a compressed body) is
refused with ``ResponseRefused`` before any of it reaches the agent. A ``101`` to a websocket upgrade ends the
exchange as ``"switched"`` (``upgrade``).
"""

from __future__ import annotations

from typing import TypedDict, cast

import h11

from supervisor.control.l7.record import RequestRecord
from supervisor.control.l7.scrub import Scrubber, unscrubbable, valid_name
from supervisor.control.l7.session.state import ResponseRefused, Session, UpstreamFailed
from supervisor.control.l7.streams import Outbox


async def pump_response(s: Session, conn: h11.Connection, rec: RequestRecord) -> str | None:
    """Relay the answer to the agent: ``"done"`` at its end, ``"switched"`` after a websocket's ``101``."""
    up = s.up
    assert up is not None
    out = Outbox()
    scrub = _scrubber(s)
    while True:
        try:
            event = up.next_event()
        except h11.RemoteProtocolError as exc:
            # the parser's message quotes the bytes it refused (escaped, so past the scrubber): from a host a
            # credential is bound to they may be an echoed secret, and this text reaches the agent and events
            said = " (the parser's message is withheld: it may quote an echoed secret)" if scrub else f": {exc}"
            raise UpstreamFailed(f"upstream: malformed response{said}"[:300]) from None
        if event is h11.NEED_DATA:
            if out.size:
                await s.agent_send(out.take())
            up.receive_data(await s.up_recv())
            continue
        if isinstance(event, h11.InformationalResponse):
            out.add(conn.send_with_data_passthrough(h11.InformationalResponse(
                **_response_head(s, scrub, event, rec))))  # fmt: skip
            if event.status_code == 101:
                if rec.upgrade != "websocket" or not rec.request_done:
                    raise UpstreamFailed("upstream: unexpected 101 Switching Protocols")
                rec.status = 101
                rec.response_started = True
                if scrub.replaced:
                    rec.extra["secrets_scrubbed"] = scrub.replaced
                await s.agent_send(out.take())
                return "switched"
            continue
        if isinstance(event, h11.Response):
            head = _response_head(s, scrub, event, rec)  # before anything of the answer is counted as sent
            rec.status = event.status_code
            rec.response_started = True
            out.add(conn.send_with_data_passthrough(h11.Response(**head)))
            continue
        if isinstance(event, h11.Data):
            rec.bytes_down += len(event.data)
            data = scrub.feed(event.data)  # h11's own bytearray: not copied again here
            if data:  # h11 passes the exact object through (a view too), typed as bytes
                out.add(conn.send_with_data_passthrough(h11.Data(data=cast(bytes, data))))
            if out.size >= s.limits.chunk:
                await s.agent_send(out.take())
            continue
        if isinstance(event, h11.EndOfMessage):
            tail = scrub.flush()
            if tail:
                out.add(conn.send_with_data_passthrough(h11.Data(data=tail)))
            if scrub.replaced:
                rec.extra["secrets_scrubbed"] = scrub.replaced
            out.add(conn.send_with_data_passthrough(h11.EndOfMessage()))
            await s.agent_send(out.take())
            return "done"
        raise UpstreamFailed(f"upstream: connection ended inside the response ({type(event).__name__})")


class _ResponseHead(TypedDict):
    """The keyword arguments of the ``h11.Response`` (or ``InformationalResponse``) the agent gets."""

    status_code: int
    headers: list[tuple[bytes, bytes]]
    reason: bytes


def _response_head(s: Session, scrub: Scrubber, event: h11.Response | h11.InformationalResponse,
                   rec: RequestRecord) -> _ResponseHead:  # fmt: skip
    """The event's fields for the agent, scrubbed: reason phrase, header names and values. A response whose
    secret cannot be replaced (in a header name, where a placeholder is no valid token; a 206 slice; a
    compressed body) raises ``ResponseRefused`` rather than reach the agent."""
    headers = []
    for raw_name, value in event.headers.raw_items():
        name = scrub.name(raw_name)
        if name != raw_name and not valid_name(name):  # h11 validated the name as it arrived
            raise ResponseRefused("a response header name held a credential's secret", "secret-in-header-name")
        headers.append((name, scrub.header(value)))
    has_body = not rec.head_method and event.status_code >= 200 and event.status_code not in (204, 304)
    if scrub and event.status_code >= 200:
        why = unscrubbable(event.status_code, headers, has_body=has_body)
        if why is not None:
            raise ResponseRefused(f"{why}, from a host a credential is bound to", "response-not-scrubbable")
    if scrub and has_body:  # a placeholder is not as long as its secret: h11 frames the scrubbed body itself
        headers = [(n, v) for n, v in headers if n.lower() not in (b"content-length", b"transfer-encoding")]
    return {"status_code": event.status_code, "headers": headers, "reason": scrub.reason(event.reason)}


def _scrubber(s: Session) -> Scrubber:
    """For each response from a host where a credential is bound: the secret becomes its placeholder."""
    return Scrubber(s.creds.secrets_at(s.name, s.port))
