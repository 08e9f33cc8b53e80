"""Each request on the connection (§3.12): its head, the checks and the policy decision, the credential rewrite.

Every step either hands the next one what it needs or refuses: a refusal (``refusal.refuse``) answers the agent,
logs the request and ends the connection, then raises :class:`Done` as a malformed request does, so the steps
read in order.
"""

from __future__ import annotations

from dataclasses import replace

import h11
import trio

from supervisor.control.l7 import answers
from supervisor.control.l7.authority import (
    AuthorityError,
    AuthoritySource,
    RequestAuthority,
    request_authority,
    same_authority,
)
from supervisor.control.l7.record import CloseReason, RequestRecord, display_path
from supervisor.control.l7.rewrite import CredentialRefusal, redact_path, redact_query, rewrite_request
from supervisor.control.l7.scrub import bound_request_headers
from supervisor.control.l7.session.refusal import refuse
from supervisor.control.l7.session.request_body import decide_body, sign
from supervisor.control.l7.session.state import Done, Session
from supervisor.control.l7.session.upgrade import arrange_filters
from supervisor.control.l7.session.upstream import forward
from supervisor.control.l7.signing import Plan, SigningConfig, SigningRefusal, plan
from supervisor.control.l7.websocket import MessageFilter, websocket_upgrade, without_extensions
from supervisor.control.policy import (
    CanonicalTarget,
    Decision,
    DenyReason,
    PolicySnapshot,
    Protocol,
    TargetError,
    Verdict,
    canonicalize_target,
)
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.request_head import MAX_HEAD_BYTES, HeadError, HeadReader, RequestHead
from supervisor.protocol.responses import ErrorCode, ErrorResponse


async def one_request(s: Session) -> bool:
    """Serve the connection's next request; ``False`` once the connection is over."""
    rec = RequestRecord(started=trio.current_time())
    try:
        return await _request(s, rec)
    except Done:
        return False


async def _request(s: Session, rec: RequestRecord) -> bool:
    """The steps of one request, in the order of §3.12."""
    parsed = await _parse(s, rec)
    if parsed is None:
        return False
    head, conn = parsed
    authority = await _bind_authority(s, conn, rec, head)
    await _refuse_unsupported(s, conn, rec, head)
    canon, policy_target = _policy_target(s, head)
    decision = await _decide(s, conn, rec, head, canon, policy_target)
    await _admit_upgrade(s, conn, rec, decision, policy_target)
    assert canon is not None  # a target without a canonical form was refused by _decide
    request = await _outgoing(s, conn, rec, head, authority, canon, decision)
    return await forward(s, conn, rec, request)


async def _parse(s: Session, rec: RequestRecord) -> tuple[RequestHead, h11.Connection] | None:
    """The next request's head, read and checked, then parsed by h11 too; ``None`` when the connection ended
    cleanly before one started."""
    try:
        head = await _read_head(s, rec)
    except HeadError as exc:
        s.malformed(rec, str(exc.problem), exc.detail)
    if head is None:
        return None
    rec.started = trio.current_time()
    rec.method = head.method.upper()
    rec.has_body = head.chunked or bool(head.content_length)
    rec.expects_continue = "100-continue" in head.tokens("expect")
    rec.head_method = rec.method == "HEAD"
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES + 1)
    conn.receive_data(head.raw + bytes(s.buffer))
    s.buffer.clear()
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        s.malformed(rec, OutcomeReason.INVALID_REQUEST, str(exc)[:200])
    if not isinstance(event, h11.Request):
        s.malformed(rec, OutcomeReason.INVALID_REQUEST, "not a request")
    return head, conn


async def _bind_authority(s: Session, conn: h11.Connection, rec: RequestRecord,
                          head: RequestHead) -> RequestAuthority:  # fmt: skip
    """Authority binding (§3.9): the request must name the tunnel's host and port."""
    try:
        authority = request_authority(head.target, head.host, tls=s.tls)
    except AuthorityError as exc:
        s.malformed(rec, OutcomeReason.INVALID_AUTHORITY, str(exc))
    if not same_authority(authority, s.name, s.port):
        rec.extra["request_authority"] = f"{authority.host}:{authority.port}"
        rec.extra["finding"] = "openshell.http.request_authority_mismatch"
        mismatch = answers.authority_mismatch(authority.host, authority.port, s.name, s.port)
        await refuse(s, conn, rec, mismatch, reason=OutcomeReason.REQUEST_AUTHORITY_MISMATCH)
    return authority


async def _refuse_unsupported(s: Session, conn: h11.Connection, rec: RequestRecord, head: RequestHead) -> None:
    """Protocols we do not carry (§3.10.1): CONNECT, h2c and upgrades other than to a websocket."""
    upgrade = head.tokens("upgrade") if "upgrade" in head.tokens("connection") else set()
    if rec.method == "CONNECT" or "h2c" in head.tokens("upgrade") or (upgrade and upgrade != {"websocket"}):
        what = "CONNECT inside a tunnel" if rec.method == "CONNECT" else f"Upgrade: {', '.join(sorted(upgrade))}"
        await refuse(s, conn, rec, answers.unsupported(what), reason=OutcomeReason.UNSUPPORTED_L7_PROTOCOL)
    rec.upgrade = "websocket" if upgrade else None


def _policy_target(s: Session, head: RequestHead) -> tuple[CanonicalTarget | None, str]:
    """The canonical target (``None`` if it has none) and the target policy and logs see, with placeholders
    redacted (§3.8.3, §3.13)."""
    try:
        canon = canonicalize_target(head.target, allow_encoded_slash=True)
    except TargetError:
        canon = None
    if canon is not None:
        redacted_query = redact_query(s.creds, canon.query)
        policy_target = redact_path(s.creds, canon.path) + ("" if redacted_query is None else "?"
                                                            + redacted_query)  # fmt: skip
    else:
        policy_target = head.target
    return canon, policy_target


async def _decide(s: Session, conn: h11.Connection, rec: RequestRecord, head: RequestHead,
                  canon: CanonicalTarget | None, policy_target: str) -> Decision:  # fmt: skip
    """The policy's decision (by the body for the agent's own protocols), recorded; a target that is not
    canonical and a denied request are refused."""
    decision = s.snapshot.decide_l7(s.l4, rec.method, policy_target)
    if decision.reason is DenyReason.L7_BODY_PENDING:  # JSON-RPC, MCP, GraphQL: the body decides
        decision = await decide_body(s, conn, rec, head, policy_target, decision)
    rec.rule, rec.endpoint, rec.l7_rule = decision.rule, decision.endpoint, decision.l7_rule
    rec.path = display_path(decision.path) if decision.path is not None else (
        display_path(redact_path(s.creds, canon.path)) if canon is not None else None)  # fmt: skip
    if canon is None or decision.reason in (DenyReason.PATH_NOT_CANONICAL, DenyReason.ENCODED_SLASH):
        # not a rule to ask for: the target itself is refused, in enforce and audit alike (§3.8.3, §3.17)
        why = "encoded-slash" if decision.reason is DenyReason.ENCODED_SLASH else "path-not-canonical"
        detail = "request-target must be canonical" + (f": {display_path(decision.detail)}" if decision.detail
                                                         and decision.reason is not None else "")  # fmt: skip
        await refuse(s, conn, rec, ErrorResponse(400, ErrorCode.INVALID_REQUEST_TARGET, detail), reason=why)
    if decision.allowed and _endpoint_protocol(s.snapshot, decision) is Protocol.WEBSOCKET \
            and not websocket_upgrade(head):  # fmt: skip
        decision = replace(
            decision,
            verdict=Verdict.DENY,
            audit=False,
            reason=DenyReason.L7_DENIED,
            detail="websocket endpoint requires a valid WebSocket upgrade request",
        )
    if not decision.allowed:
        await refuse(s, conn, rec, _l7_denied(s, decision, rec),
                     reason=str(decision.reason) if decision.reason else "l7-denied",
                     detail=display_path(decision.detail))  # fmt: skip
    return decision


async def _admit_upgrade(s: Session, conn: h11.Connection, rec: RequestRecord, decision: Decision,
                         policy_target: str) -> None:  # fmt: skip
    """An allowed request: a websocket upgrade only where nothing would stop being judged after its ``101``; the
    decision recorded, with the websocket's message filters (``upgrade``)."""
    if rec.upgrade == "websocket" and decision.l7 and \
            _endpoint_protocol(s.snapshot, decision) is not Protocol.WEBSOCKET:  # fmt: skip
        # after a 101 nothing more is judged: on an endpoint with L7 rules that would switch them off, so the
        # upgrade needs an endpoint that says protocol: websocket (docs/design.md "Upgrades")
        where = f" (endpoint {decision.endpoint})" if decision.endpoint else ""
        refusal = ErrorResponse(
            403,
            ErrorCode.UNSUPPORTED_L7_PROTOCOL,
            f"Upgrade: websocket is not allowed on {s.name}:{s.port}{where}: its L7 "
            "rules would no longer apply; an endpoint with protocol: websocket allows it",
        )
        await refuse(s, conn, rec, refusal, reason=OutcomeReason.WEBSOCKET_UPGRADE_NOT_ALLOWED)
    rec.decision = "audit" if decision.audit else "allow"
    if rec.upgrade == "websocket" and _endpoint_protocol(s.snapshot, decision) is Protocol.WEBSOCKET:
        arrange_filters(s, rec, policy_target)
    if decision.audit:
        rec.reason = str(decision.reason) if decision.reason else None
        rec.detail = display_path(decision.detail)


async def _signing_plan(s: Session, conn: h11.Connection, rec: RequestRecord, head: RequestHead,
                        canon: CanonicalTarget, decision: Decision) -> Plan | None:  # fmt: skip
    """credential_signing: the agent's signature is dropped here and the final request signed in ``_outgoing``
    (``signing``); ``None`` where the endpoint signs nothing."""
    if (signing := _endpoint_signing(s.snapshot, decision)) is None:
        return None
    try:
        return plan(signing, s.creds, host=s.name, port=s.port,
                    path=redact_path(s.creds, canon.path), query=canon.query, headers=head.headers,
                    has_body=rec.has_body, content_length=None if head.chunked else head.content_length
                    )  # fmt: skip
    except SigningRefusal as exc:
        if exc.code is ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH:
            rec.extra["finding"] = "openshell.http.credential_endpoint_mismatch"
        await refuse(s, conn, rec, ErrorResponse(exc.code.status, exc.code, exc.detail),
                     reason=str(exc.code), detail=exc.detail)  # fmt: skip


async def _outgoing(
    s: Session,
    conn: h11.Connection,
    rec: RequestRecord,
    head: RequestHead,
    authority: RequestAuthority,
    canon: CanonicalTarget,
    decision: Decision,
) -> h11.Request:
    """The request as it goes upstream: credentials resolved only now, for this endpoint only; the headers a
    bound host, a message filter or a signature need."""
    sign_plan = await _signing_plan(s, conn, rec, head, canon, decision)
    try:
        rewritten = rewrite_request(
            s.creds, host=s.name, port=s.port, path=canon.path, query=canon.query,
            headers=head.headers if sign_plan is None else sign_plan.headers,
            credentials_enabled=authority.source is not AuthoritySource.NONE,
        )  # fmt: skip
    except CredentialRefusal as exc:
        rec.decision = "deny"
        if exc.code is ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH:
            rec.extra["finding"] = "openshell.http.credential_endpoint_mismatch"
        await refuse(s, conn, rec, ErrorResponse(exc.status, exc.code, exc.detail),
                     reason=str(exc.code), detail=exc.logged_detail)  # fmt: skip
    rec.credentials = rewritten.used
    headers = [(n.encode("ascii"), v.encode("utf-8")) for n, v in rewritten.headers]
    if isinstance(s.ws_filter, MessageFilter):  # no compression: every message must be read as sent
        headers = without_extensions(headers)
    if s.creds.secrets_at(s.name, s.port):  # every request there, not only those that carried one
        headers = bound_request_headers(headers)
    if head.host is None:
        headers.append((b"Host", _authority_text(s.name, s.port, s.tls).encode("ascii")))
    if sign_plan is not None:
        headers = await sign(s, conn, rec, sign_plan, rewritten.target, headers)
    if rec.body is not None:  # read whole already, and its 100 Continue answered by us
        headers = [(n, v) for n, v in headers if n.lower() != b"expect"]
    return h11.Request(method=rec.method.encode("ascii"), target=rewritten.target.encode("ascii"),
                       headers=headers)  # fmt: skip


async def _read_head(s: Session, rec: RequestRecord) -> RequestHead | None:
    """The next head, checked (:class:`HeadError` otherwise), or ``None`` when the connection ends cleanly (EOF
    or idle) before one starts. What follows the head is left in ``s.buffer``."""
    reader = HeadReader(MAX_HEAD_BYTES)
    reader.receive_data(s.buffer)
    s.buffer.clear()
    deadline: float | None = None
    while True:
        head = reader.next_event()
        if isinstance(head, RequestHead):
            s.buffer += reader.trailing_data()
            return head
        if reader.buffered and deadline is None:
            deadline = trio.current_time() + s.limits.head_timeout
        data = await s.agent_recv(None if deadline is None else deadline - trio.current_time())
        if data is None:
            if deadline is None:
                s.end(CloseReason.IDLE)
                return None
            s.malformed(rec, OutcomeReason.HEAD_TIMEOUT, "request head not complete in time")
        if not data:
            if reader.buffered:
                s.malformed(rec, OutcomeReason.TRUNCATED_HEAD, "connection closed inside a request head")
            s.end(CloseReason.AGENT)
            return None
        reader.receive_data(data)


def _l7_denied(s: Session, decision: Decision, rec: RequestRecord) -> ErrorResponse:
    binary = s.fields.get("binary")
    return answers.policy_denied(decision, method=rec.method, path=rec.path or "/", host=s.name,
                                 port=s.port, detail=display_path(decision.detail) or "",
                                 binary=binary if isinstance(binary, str) else None)  # fmt: skip


def _authority_text(host: str, port: int, tls: bool) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == (443 if tls else 80) else f"{shown}:{port}"


def _endpoint_signing(snapshot: PolicySnapshot, decision: Decision) -> SigningConfig | None:
    """The admitting endpoint's ``credential_signing``, else that of another endpoint of this host:port that has one
    (the ambiguity check makes overlapping signing endpoints agree)."""
    policy = snapshot.policy
    if policy is None:
        return None
    candidates = sorted(policy.endpoints_for(decision.host, decision.port), key=lambda c: c.label != decision.endpoint)
    for cep in candidates:
        ep = cep.endpoint
        if ep.credential_signing is not None and ep.signing_service is not None:
            return SigningConfig(ep.credential_signing, ep.signing_service, ep.signing_region)
    return None


def _endpoint_protocol(snapshot: PolicySnapshot, decision: Decision) -> Protocol | None:
    if snapshot.policy is None or decision.endpoint is None:
        return None
    for cep in snapshot.policy.endpoints_for(decision.host, decision.port):
        if cep.label == decision.endpoint:
            return cep.endpoint.protocol
    return None
