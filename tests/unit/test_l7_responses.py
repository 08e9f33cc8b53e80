"""The client-visible refusal catalogue (§3.17): stable codes, exact framing, Connection: close."""

from __future__ import annotations

import json

import h11

from supervisor.protocol.responses import ErrorCode, ErrorResponse, L7Denial


def test_render_is_a_complete_parseable_response() -> None:
    response = ErrorResponse(403, ErrorCode.REQUEST_AUTHORITY_MISMATCH, "HTTP request authority does not match",
                             headers=(("X-OpenShell-Policy", "api"),))  # fmt: skip
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "a.test")]))
    client.send(h11.EndOfMessage())
    client.receive_data(response.render())
    head = client.next_event()
    assert isinstance(head, h11.Response) and head.status_code == 403 and head.reason == b"Forbidden"
    headers = dict(head.headers)
    assert headers[b"content-type"] == b"application/json" and headers[b"connection"] == b"close"
    assert headers[b"x-openshell-policy"] == b"api"
    body = client.next_event()
    assert isinstance(body, h11.Data) and int(headers[b"content-length"]) == len(body.data)
    assert json.loads(body.data) == {
        "error": "request_authority_mismatch",
        "detail": "HTTP request authority does not match",
    }
    assert isinstance(client.next_event(), h11.EndOfMessage)


def test_codes_are_the_spec_strings() -> None:
    assert ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH == "credential_endpoint_mismatch"
    assert ErrorCode.CREDENTIAL_UNAVAILABLE == "credential_unavailable"
    assert ErrorCode.UNSUPPORTED_L7_PROTOCOL == "unsupported_l7_protocol"
    assert ErrorCode.POLICY_DENIED == "policy_denied"


def test_the_l7_denial_body_is_unchanged() -> None:
    """The §3.10.4 deny an agent reads: the same JSON, key for key and in order, as before it was typed."""
    denial = L7Denial(policy="github", reason="no-matching-l7-rule", method="POST", path="/repos", host="api.test",
                      port=443, binary="/usr/bin/curl", next_steps=("ask the sandbox operator",))  # fmt: skip
    body = ErrorResponse(403, ErrorCode.POLICY_DENIED, "denied", denial).body()
    assert body == (
        b'{"error":"policy_denied","detail":"denied","policy":"github","rule":"POST /repos",'
        b'"reason":"no-matching-l7-rule","layer":"l7","protocol":"rest","method":"POST","path":"/repos",'
        b'"host":"api.test","port":443,"binary":"/usr/bin/curl","rule_missing":{"type":"rest_allow","layer":"l7",'
        b'"method":"POST","path":"/repos","host":"api.test","port":443},"next_steps":["ask the sandbox operator"]}\n'
    )
    without_binary = json.loads(ErrorResponse(403, ErrorCode.POLICY_DENIED, "d", L7Denial(None, None, "GET", "/",
                                                                                         "h", 80)).body())  # fmt: skip
    assert "binary" not in without_binary and without_binary["policy"] is None
