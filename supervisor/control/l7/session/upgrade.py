"""The upgrade (§3.10.5): what judges a websocket's messages, and the raw relay a ``101`` turns the connection into.

After the ``101`` nothing but these filters judges: a websocket endpoint's one answer for every text message, or
GraphQL over WebSocket's rules for every whole message.
"""

from __future__ import annotations

import functools

import h11
import trio

from supervisor.control.l7.graphql import decide_ws_message
from supervisor.control.l7.record import CloseReason, RequestRecord, display_path
from supervisor.control.l7.session.state import STREAM_ERRORS, Session
from supervisor.control.l7.websocket import (
    ClientFrameFilter,
    CloseCode,
    FilterStop,
    MessageFilter,
    client_close_frame,
    server_close_frame,
)
from supervisor.control.policy import BodyRoute
from supervisor.link.relay import Flow, RelayEnd, relay


def arrange_filters(s: Session, rec: RequestRecord, policy_target: str) -> None:
    """The filters of an admitted upgrade on a ``protocol: websocket`` endpoint, for ``relay_switched``."""
    # payloads are never matched (§3.10.5): one answer holds for every text message of this connection
    text = s.snapshot.decide_l7(s.l4, "WEBSOCKET_TEXT", policy_target)
    s.ws_text_decision = text
    s.ws_filter = None if text.allowed else ClientFrameFilter()
    graphql_route = s.snapshot.graphql_ws_route(s.l4, policy_target)
    if graphql_route is not None:  # GraphQL over WebSocket: its rules judge every whole message
        s.ws_text_decision = None
        s.ws_filter = MessageFilter(functools.partial(judge_ws_message, s, graphql_route, rec))


async def relay_switched(s: Session, conn: h11.Connection, rec: RequestRecord) -> None:
    """After ``101``: raw bytes both ways (``upgrade``); on a websocket endpoint whose ``WEBSOCKET_TEXT`` is
    denied, the agent's first text message closes both sides with 1008 (``websocket``)."""
    s.stats.upgraded = True
    up = s.up
    assert up is not None and s.upstream is not None
    frames = s.ws_filter
    first_bytes = conn.trailing_data[0]
    await s.up_send(frames.feed(first_bytes) if frames is not None else first_bytes)
    await s.agent_send(up.trailing_data[0])
    if frames is None or frames.stopped is None:

        def through_frames(data: bytes) -> tuple[bytes, Flow]:
            assert frames is not None
            passed = frames.feed(data)
            return passed, Flow.MORE if frames.stopped is None else Flow.STOP

        # TLS on both sides has no half-close: the first side to end ends both; the caller closes them
        relayed = await relay(
            s.agent, s.upstream, idle_timeout=s.limits.idle_timeout, chunk=s.limits.chunk,
            half_close=(), filter_a=through_frames if frames is not None else None, close=False,
        )  # fmt: skip
        s.stats.bytes_up += relayed.bytes_a_to_b
        s.stats.bytes_down += relayed.bytes_b_to_a
        s.clean = s.clean and relayed.error is None
    if frames is not None and frames.stopped is not None:
        await _close_websocket(s, rec, frames.stopped)
        return
    why = (CloseReason.IDLE if relayed.closed_by == RelayEnd.IDLE else CloseReason.AGENT
           if relayed.closed_by == RelayEnd.A else CloseReason.UPSTREAM)  # fmt: skip
    s.end(why, relayed.error, clean=s.clean)


def judge_ws_message(s: Session, route: BodyRoute, rec: RequestRecord, message: bytes) -> bool:
    """GraphQL over WebSocket: one whole client message; each subscribe/start decided is an ``http`` event (a
    denied one is logged by ``_close_websocket``)."""
    decision = decide_ws_message(route, message)
    if decision is None:
        return True
    s.ws_text_decision = decision
    if not decision.allowed:
        return False
    event = RequestRecord(started=trio.current_time(), method="WEBSOCKET_TEXT", path=rec.path,
                          decision="audit" if decision.audit else "allow", rule=decision.rule,
                          endpoint=decision.endpoint, l7_rule=decision.l7_rule,
                          reason=str(decision.reason) if decision.audit and decision.reason else None,
                          detail=decision.detail if decision.audit else None)  # fmt: skip
    if decision.operation is not None:
        event.extra["operation"] = decision.operation
    s.request_event(event)
    return True


async def _close_websocket(s: Session, rec: RequestRecord, stop: FilterStop) -> None:
    denied = stop in (FilterStop.TEXT_DENIED, FilterStop.MESSAGE_DENIED)
    code = CloseCode.POLICY_VIOLATION if denied else (
        CloseCode.MESSAGE_TOO_BIG if stop is FilterStop.MESSAGE_TOO_BIG else CloseCode.PROTOCOL_ERROR)  # fmt: skip
    reason = {FilterStop.TEXT_DENIED: "text messages are not permitted by policy",
              FilterStop.MESSAGE_DENIED: "message not permitted by policy",
              FilterStop.MESSAGE_TOO_BIG: "message too big"}.get(stop, "protocol error")  # fmt: skip
    text = s.ws_text_decision
    event = RequestRecord(started=trio.current_time(), method="WEBSOCKET_TEXT", path=rec.path, decision="deny",
                          rule=text.rule if text else rec.rule, endpoint=text.endpoint if text else rec.endpoint,
                          reason=str(stop), status=int(code),
                          detail=display_path(text.detail) if denied and text else reason)  # fmt: skip
    if denied and text is not None and text.operation is not None:
        event.extra["operation"] = text.operation
    s.request_event(event)
    with trio.move_on_after(1.0):
        try:
            await s.agent.send_all(server_close_frame(code, reason))
            assert s.upstream is not None
            await s.upstream.send_all(client_close_frame(code, reason))
        except STREAM_ERRORS:
            s.clean = False
    s.end(CloseReason.DENIED if denied else CloseReason.MALFORMED, str(stop), clean=s.clean)
