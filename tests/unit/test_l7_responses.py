"""The client-visible refusal catalogue (§3.17): stable codes, exact framing, Connection: close."""

from __future__ import annotations

import json

import h11

from supervisor.protocol.responses import ErrorCode, ErrorResponse


def test_render_is_a_complete_parseable_response() -> None:
    response = ErrorResponse(403, ErrorCode.REQUEST_AUTHORITY_MISMATCH, "HTTP request authority does not match",
                             {"host": "a.test"}, (("X-OpenShell-Policy", "api"),))  # fmt: skip
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
        "host": "a.test",
    }
    assert isinstance(client.next_event(), h11.EndOfMessage)


def test_codes_are_the_spec_strings() -> None:
    assert ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH == "credential_endpoint_mismatch"
    assert ErrorCode.CREDENTIAL_UNAVAILABLE == "credential_unavailable"
    assert ErrorCode.UNSUPPORTED_L7_PROTOCOL == "unsupported_l7_protocol"
    assert ErrorCode.POLICY_DENIED == "policy_denied"


def test_fields_never_override_error_and_detail() -> None:
    body = json.loads(ErrorResponse(500, ErrorCode.CREDENTIAL_UNAVAILABLE, "d", {"error": "x", "detail": "y"}).body())
    assert body == {"error": "credential_unavailable", "detail": "d"}
