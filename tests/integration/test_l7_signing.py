"""``credential_signing`` end to end on loopback, from the agent's side: the agent signs with the placeholder key pair
its environment holds (as an AWS SDK does); control re-signs with the real pair; the origin verifies every signature
with the real secret key (``supervisor/control/l7/sigv4.py``, tested against the AWS test suite) and records what
arrived, so "the real key never reached the agent" and "nothing reached the origin" are asserted where they matter.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import ssl
from datetime import UTC, datetime
from typing import Any

import pytest
import trio
import trustme

from supervisor.control.credentials import Credentials
from supervisor.control.l7 import InterceptionCA, sigv4
from supervisor.control.policy import PolicyStore, compile_policy, load_policy_text

from .test_l7_inspect import Env, Origin, Reply, Seen, agent_socket, http_requests, raw_exchange

KEY_ID = "AKIAREALKEY000000001"
SECRET = "Real/Secret+Key/0000000000000000000000001"
TOKEN = "FwoGZXIvYXdzEREAL-session-token-0001"
OTHER_KEY_ID = "AKIAOTHERKEY00000002"
OTHER_SECRET = "Other/Secret+Key/000000000000000000000002"
ID_PLACEHOLDER = "openshell:resolve:env:AWS_ACCESS_KEY_ID"
SECRET_PLACEHOLDER = "openshell:resolve:env:AWS_SECRET_ACCESS_KEY"
TOKEN_PLACEHOLDER = "openshell:resolve:env:AWS_SESSION_TOKEN"

POLICY = """
version: 1
network_policies:
  aws:
    endpoints:
      - host: s3.test
        port: 443
        credential_signing: sigv4
        signing_service: s3
        signing_region: eu-west-1
      - host: api.test
        port: 443
        credential_signing: sigv4:body
        signing_service: execute-api
      - host: other.test
        port: 443
        credential_signing: sigv4:no_body
        signing_service: s3
    binaries: [{path: /usr/bin/curl}]
"""


@pytest.fixture
async def env(nursery: trio.Nursery) -> Env:
    authority = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("s3.test", "api.test", "other.test").configure_cert(server_ctx)
    tls_origin, plain_origin = Origin(server_ctx), Origin(None)
    await tls_origin.start(nursery)
    store = PolicyStore(compile_policy(load_policy_text(POLICY, "test.yaml")), source="test.yaml")
    credentials = Credentials.from_mapping({
        "AWS": {"access_key_id": KEY_ID, "secret_access_key": SECRET, "session_token": TOKEN,
                "hosts": ["s3.test:443", "api.test:443"]},
        "OTHER": {"access_key_id": OTHER_KEY_ID, "secret_access_key": OTHER_SECRET, "hosts": ["other.test:443"]},
    }, environ={})  # fmt: skip
    return Env(tls_origin, plain_origin, _CA, authority, store, credentials, io.StringIO())


_CA = InterceptionCA.generate("l7-signing-tests")


# --- the agent's SDK and the origin's verifier ------------------------------------------------------------------


def agent_signed(method: str, host: str, path: str, headers: dict[str, str], payload_hash: str,
                 key_id: str = ID_PLACEHOLDER, secret: str = SECRET_PLACEHOLDER) -> dict[str, str]:  # fmt: skip
    """What an SDK holding the placeholder pair sends: its own (worthless) signature."""
    amz_date = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = {**headers, "Host": host, "X-Amz-Date": amz_date, "X-Amz-Content-Sha256": payload_hash,
           "X-Amz-Security-Token": TOKEN_PLACEHOLDER}  # fmt: skip
    target, _q, query = path.partition("?")
    signed = sigv4.sign(method=method, path=target, query=query or None, headers=list(out.items()),
                        signed=[n.lower() for n in out], payload_hash=payload_hash, access_key_id=key_id,
                        secret_key=secret, region="eu-west-1", service="s3", amz_date=amz_date,
                        normalize=False)  # fmt: skip
    return {**out, "Authorization": signed.authorization}


def verify(seen: Seen, *, service: str, region: str, secret: str = SECRET, key_id: str = KEY_ID) -> None:
    """The origin's check, as AWS makes it: the signature over what arrived, with the real secret key."""
    auth = seen.headers["authorization"]
    match = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                         r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})", auth)  # fmt: skip
    assert match is not None, auth
    assert (match[1], match[3], match[4]) == (key_id, region, service)
    names = match[5].split(";")
    assert {"host", "x-amz-date"} <= set(names) and all(n in seen.headers for n in names)
    declared = seen.headers.get("x-amz-content-sha256")
    payload_hash = declared or hashlib.sha256(seen.body).hexdigest()
    if declared not in ("UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"):
        assert payload_hash == hashlib.sha256(seen.body).hexdigest()
    path, _q, query = seen.target.partition("?")
    expected = sigv4.sign(method=seen.method, path=path, query=query or None, headers=list(seen.headers.items()),
                          signed=names, payload_hash=payload_hash, access_key_id=key_id, secret_key=secret,
                          region=region, service=service, amz_date=seen.headers["x-amz-date"],
                          normalize=service != "s3")  # fmt: skip
    assert expected.authorization == auth


def leaked(env: Env, replies: list[Reply]) -> list[str]:
    seen = "".join(r.body.decode("latin-1") + json.dumps(r.headers) for r in replies) + env.log.getvalue()
    return [name for name, value in (("key id", KEY_ID), ("secret", SECRET), ("token", TOKEN)) if value in seen]


def calls(env: Env, host: str, items: list[tuple[str, str, dict[str, str], bytes | None]]) -> Any:
    return lambda port: http_requests(agent_socket(port, env.ca.cert_pem, host), host, items)


# --- what works -------------------------------------------------------------------------------------------------


async def test_a_get_signed_with_the_placeholder_pair_reaches_the_origin_signed_with_the_real_one(env: Env) -> None:
    headers = agent_signed("GET", "s3.test", "/bucket?list-type=2&prefix=a%2Fb", {}, sigv4.EMPTY_SHA256)
    replies, _ = await env.run(calls(env, "s3.test", [("GET", "/bucket?list-type=2&prefix=a%2Fb", headers, None)]),
                               host="s3.test")  # fmt: skip
    assert replies[0].status == 200
    (seen,) = env.tls_origin.requests
    verify(seen, service="s3", region="eu-west-1")
    assert seen.headers["x-amz-security-token"] == TOKEN
    assert "openshell:resolve" not in json.dumps(seen.headers)
    # the origin echoes every header back: the agent reads placeholders where the real values were
    echoed = replies[0].json()["headers"]
    assert ID_PLACEHOLDER in echoed["authorization"] and echoed["x-amz-security-token"] == TOKEN_PLACEHOLDER
    assert leaked(env, replies) == []
    (event,) = env.events()
    assert event["injected"] == 1 and event["signed"] == "hashed" and "AWS" not in json.dumps(event)


async def test_a_body_with_its_hash_is_buffered_hashed_and_signed(env: Env) -> None:
    body = b"object bytes " * 1000
    headers = agent_signed("PUT", "s3.test", "/bucket/key", {"Content-Type": "text/plain"},
                           hashlib.sha256(body).hexdigest())  # fmt: skip
    replies, _ = await env.run(calls(env, "s3.test", [("PUT", "/bucket/key", headers, body)]), host="s3.test")
    assert replies[0].status == 200
    (seen,) = env.tls_origin.requests
    assert seen.body == body
    verify(seen, service="s3", region="eu-west-1")
    assert "content-type" in seen.headers["authorization"]
    assert leaked(env, replies) == []


async def test_expect_100_continue_is_answered_so_the_client_sends_the_body_to_be_signed(env: Env) -> None:
    body = b"x" * 5000
    headers = agent_signed("PUT", "s3.test", "/bucket/k", {"Expect": "100-continue",
                                                          "Content-Length": str(len(body))},
                           hashlib.sha256(body).hexdigest())  # fmt: skip

    def client(port: int) -> bytes:
        sock = agent_socket(port, env.ca.cert_pem, "s3.test")
        head = "PUT /bucket/k HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode())
        sock.settimeout(10)
        interim = sock.recv(65536)  # the client waits for 100 before it sends the body
        assert interim.startswith(b"HTTP/1.1 100"), interim
        return interim + raw_exchange(sock, body + b"", wait=5)

    answer, _ = await env.run(client, host="s3.test")
    assert b"HTTP/1.1 200" in answer and answer.count(b"HTTP/1.1 100") == 1
    (seen,) = env.tls_origin.requests
    assert seen.body == body and "expect" not in seen.headers
    verify(seen, service="s3", region="eu-west-1")


@pytest.mark.parametrize("marker", ["UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"])
async def test_unsigned_payloads_are_streamed_and_signed_as_unsigned(env: Env, marker: str) -> None:
    body = b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:NhCmhg==\r\n\r\n" if "TRAILER" in marker else b"hello"
    extra = {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": "5",
             "X-Amz-Trailer": "x-amz-checksum-crc32"} if "TRAILER" in marker else {}  # fmt: skip
    headers = agent_signed("PUT", "s3.test", "/bucket/k", extra, marker)
    replies, _ = await env.run(calls(env, "s3.test", [("PUT", "/bucket/k", headers, body)]), host="s3.test")
    assert replies[0].status == 200
    (seen,) = env.tls_origin.requests
    assert seen.body == body and seen.headers["x-amz-content-sha256"] == marker
    verify(seen, service="s3", region="eu-west-1")
    if extra:
        assert "x-amz-trailer" in seen.headers["authorization"]


async def test_no_body_mode_signs_unsigned_payload_whatever_the_agent_hashed(env: Env) -> None:
    headers = agent_signed("PUT", "other.test", "/b/k", {}, hashlib.sha256(b"abc").hexdigest(),
                           key_id="openshell:resolve:env:OTHER_ACCESS_KEY_ID")  # fmt: skip
    replies, _ = await env.run(calls(env, "other.test", [("PUT", "/b/k", headers, b"abc")]), host="other.test")
    assert replies[0].status == 200
    (seen,) = env.tls_origin.requests
    assert seen.headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD" and "x-amz-security-token" not in seen.headers
    verify(seen, service="s3", region="us-east-1", secret=OTHER_SECRET, key_id=OTHER_KEY_ID)


async def test_body_mode_hashes_for_a_service_without_a_payload_header(env: Env) -> None:
    body = json.dumps({"q": 1}).encode()
    headers = agent_signed("POST", "api.test", "/v1/run", {"Content-Type": "application/json"},
                           hashlib.sha256(body).hexdigest())  # fmt: skip
    replies, _ = await env.run(calls(env, "api.test", [("POST", "/v1/run", headers, body)]), host="api.test")
    assert replies[0].status == 200
    (seen,) = env.tls_origin.requests
    verify(seen, service="execute-api", region="us-east-1")


# --- what is refused: nothing reaches the origin ---------------------------------------------------------------


REFUSALS: list[tuple[str, str, str, dict[str, str], int, str]] = [
    ("another-key-id", "s3.test", "/b", {"key_id": "AKIDSOMEONEELSE0000"}, 403, "wrong credential"),
    ("a-pair-bound-elsewhere", "s3.test", "/b", {"key_id": "openshell:resolve:env:OTHER_ACCESS_KEY_ID"}, 403,
     "bound to other endpoints"),
    ("unsigned", "s3.test", "/b", {"unsigned": "1"}, 403, "placeholder key pair"),
    ("presigned", "s3.test", "/b?X-Amz-Credential=AKID%2F2&X-Amz-Signature=00", {}, 400, "presigned URLs"),
    ("chunk-signatures", "s3.test", "/b", {"hash": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"}, 400, "chunk signatures"),
    ("body-mode-streaming", "api.test", "/b", {"hash": "STREAMING-UNSIGNED-PAYLOAD-TRAILER"}, 400, "sigv4:body"),
    ("over-10-MiB", "api.test", "/b", {"length": str(10 * 1024 * 1024 + 1)}, 400, "at most 10485760"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "host", "path", "how", "status", "fragment"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_refused_before_anything_reaches_the_origin(env: Env, row: str, host: str, path: str, how: dict[str, str],
                                                          status: int, fragment: str) -> None:  # fmt: skip
    headers = agent_signed("PUT", host, path, {}, how.get("hash", sigv4.EMPTY_SHA256),
                           key_id=how.get("key_id", ID_PLACEHOLDER))  # fmt: skip
    if "unsigned" in how:
        del headers["Authorization"]
    length = how.get("length", "0")

    def client(port: int) -> bytes:
        sock = agent_socket(port, env.ca.cert_pem, host)
        all_headers = {**headers, "Content-Length": length}
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in all_headers.items()) + "\r\n"
        return raw_exchange(sock, head.encode(), wait=5)

    answer, _ = await env.run(client, host=host)
    assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer[:200]
    assert fragment in answer.decode("latin-1")
    assert env.tls_origin.requests == []
    assert leaked(env, [Reply(status, {}, answer)]) == []


@pytest.mark.parametrize("placeholder", [SECRET_PLACEHOLDER, ID_PLACEHOLDER, TOKEN_PLACEHOLDER])
async def test_the_pair_is_never_placed_raw_in_a_request(env: Env, placeholder: str) -> None:
    """The agent signs properly but asks for a value of the pair in another header: refused, nothing sent."""
    headers = agent_signed("GET", "s3.test", "/b", {"X-Leak": placeholder}, sigv4.EMPTY_SHA256)
    replies, _ = await env.run(calls(env, "s3.test", [("GET", "/b", headers, None)]), host="s3.test")
    assert replies[0].status == 500 and b"access key pair" in replies[0].body
    assert env.tls_origin.requests == []
