"""The inference routes file, the request shapes and the DNS answer for inference.local (control/inference,
control/dns_answers.py): what is refused at load, what the agent may send, what the backend receives."""

from __future__ import annotations

import json
from pathlib import Path

import dns.message
import pytest
import trio

from supervisor.control.credentials import Credentials
from supervisor.control.dns_answers import DnsAction, plan_answer
from supervisor.control.inference.routes import BackendKind, RoutesInvalid, load_routes_text
from supervisor.control.inference.shapes import (
    BodyInvalid,
    Shape,
    backend_headers,
    match_shape,
    model_body,
    models_body,
    read_body,
)
from supervisor.control.inference.store import RoutesStore, watch_routes_file
from supervisor.control.policy.identity import BinaryIdentity
from supervisor.jsonlog import JsonLog
from tests.waiting import await_until

GOOD = """\
version: 1
routes:
  chat:
    kind: openai
    base_url: https://models.example.com/v1/
    credential: KEY
    models: [small, large]
    model_rewrite: {small: small-2025}
  claude:
    kind: anthropic
    base_url: https://10.0.0.5:8443/v1
    credential: KEY
    models: [small]
    allowed_ips: [10.0.0.5/32]
    binaries: [{path: /usr/bin/python3*}]
"""


def _errors(text: str) -> list[str]:
    with pytest.raises(RoutesInvalid) as caught:
        load_routes_text(text, "routes.yaml")
    return list(caught.value.errors)


def test_a_valid_file_loads_with_its_routes() -> None:
    routes = load_routes_text(GOOD, "routes.yaml")
    chat = routes.route_for(BackendKind.OPENAI, "small")
    claude = routes.route_for(BackendKind.ANTHROPIC, "small")
    assert chat is not None and claude is not None
    assert (chat.host, chat.port, chat.prefix, chat.base_url) == ("models.example.com", 443, "/v1",
                                                                  "https://models.example.com/v1")  # fmt: skip
    assert chat.backend_path("/v1/chat/completions") == "/v1/chat/completions"
    assert chat.backend_model("small") == "small-2025" and chat.backend_model("large") == "large"
    assert claude.port == 8443 and not claude.exact_host and claude.allowed_ips == ("10.0.0.5/32",)
    assert routes.route_for(BackendKind.ANTHROPIC, "large") is None


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ("base_url: http://models.example.com/v1", "base_url"),  # the backend's TLS is verified: https only
        ("base_url: https://user:pw@models.example.com/v1", "base_url"),
        ("base_url: https://inference.local/v1", "base_url"),  # never itself
        ("base_url: https://x.inference.local/v1", "base_url"),
        ("base_url: https://*.example.com/v1", "base_url"),
        ("kind: bedrock", "kind"),
        ("models: []", "models"),
        ("models: [a, a]", "models[1]"),
        ("model_rewrite: {other: x}", "model_rewrite.other"),
        ("allowed_ips: [127.0.0.0/8]", "allowed_ips"),  # always blocked, as in the policy
        ("binaries: [{path: python3}]", "binaries[0].path"),
        ("secret: sk-123", "chat"),  # a secret never lives in the routes file
    ],
)
def test_what_a_route_may_not_say(change: str, where: str) -> None:
    key = change.split(":", 1)[0]
    lines = [line for line in GOOD.splitlines()[:8] if not line.strip().startswith(f"{key}:")]
    errors = _errors("\n".join([*lines, f"    {change}"]) + "\n")
    assert any(e.startswith(f"routes.chat.{where}") or e.startswith(f"routes.{where}") for e in errors), errors


def test_one_model_is_served_by_one_route_per_kind() -> None:
    text = (
        GOOD
        + "  other:\n    kind: openai\n    base_url: https://b.example.com\n    credential: KEY\n    models: [large]\n"
    )
    assert any("'large' is served by route" in e for e in _errors(text))


def test_a_route_names_a_secret_of_the_credentials_file_never_a_key_pair() -> None:
    routes = load_routes_text(GOOD, "routes.yaml")
    assert routes.check_credentials(Credentials.from_mapping({"KEY": {"secret": "sk-live-1234", "hosts": []}})) == []
    missing = routes.check_credentials(Credentials.empty())
    assert missing and "not in the credentials file" in missing[0]
    pair = Credentials.from_mapping({"KEY": {"access_key_id": "AKIDEXAMPLE", "secret_access_key": "s3cr3t-value",
                                             "hosts": []}})  # fmt: skip
    assert "access key pair" in routes.check_credentials(pair)[0]


def test_binaries_restrict_a_route_and_relaxed_identity_closes_it() -> None:
    claude = load_routes_text(GOOD, "routes.yaml").route_for(BackendKind.ANTHROPIC, "small")
    assert claude is not None
    python = BinaryIdentity("/usr/bin/python3.11", None)
    assert claude.usable_by(python, relaxed=False)
    assert not claude.usable_by(BinaryIdentity("/usr/bin/curl", None), relaxed=False)
    assert not claude.usable_by(python, relaxed=True) and not claude.usable_by(None, relaxed=False)


@pytest.mark.parametrize(
    ("method", "target", "shape"),
    [
        ("POST", "/v1/chat/completions", Shape.CHAT),
        ("POST", "/v1/completions", Shape.COMPLETIONS),
        ("POST", "/v1/responses", Shape.RESPONSES),
        ("POST", "/v1/embeddings", Shape.EMBEDDINGS),
        ("POST", "/v1/messages", Shape.MESSAGES),
        ("GET", "/v1/models", Shape.MODELS),
        ("GET", "/v1/models?limit=20", Shape.MODELS),
        ("GET", "/v1/models/org/name", Shape.MODEL),
        ("GET", "/v1/chat/completions", None),
        ("POST", "/v1/chat/completions?api-version=1", None),
        ("POST", "/v1/chat%2Fcompletions", None),
        ("POST", "/v1//chat/completions", None),
        ("POST", "/v1/./chat/completions", None),
        ("POST", "/v1/files", None),
        ("POST", "/model/x/invoke", None),  # Bedrock-style: a later issue
        ("DELETE", "/v1/models/x", None),
    ],
)
def test_only_the_request_shapes_pass(method: str, target: str, shape: Shape | None) -> None:
    match = match_shape(method, target)
    assert (match.shape if match else None) is shape


def test_the_body_is_read_strictly_and_the_model_rewritten() -> None:
    route = load_routes_text(GOOD, "routes.yaml").route_for(BackendKind.OPENAI, "small")
    assert route is not None
    with pytest.raises(BodyInvalid):
        read_body(b'{"model": "small", "model": "large"}')  # which one would the backend read?
    with pytest.raises(BodyInvalid):
        read_body(b'{"messages": []}')
    with pytest.raises(BodyInvalid):
        read_body(b"[1]")
    data = b'{"model": "large", "stream": true}'
    same = model_body(read_body(data), data, route)
    assert same.data == data and same.stream and same.model == "large"
    data = b'{"model": "small", "messages": []}'
    rewritten = model_body(read_body(data), data, route)
    assert json.loads(rewritten.data) == {"model": "small-2025", "messages": []} and rewritten.model == "small"


def test_the_backend_gets_its_key_and_none_of_the_callers_headers() -> None:
    routes = load_routes_text(GOOD, "routes.yaml")
    caller = [
        ("Authorization", "Bearer agent"),
        ("x-api-key", "agent"),
        ("Cookie", "c"),
        ("X-Stainless-OS", "x"),
        ("Content-Type", "application/json"),
        ("anthropic-version", "2023-06-01"),
        ("Host", "inference.local"),
    ]
    chat, claude = routes.route_for(BackendKind.OPENAI, "large"), routes.route_for(BackendKind.ANTHROPIC, "small")
    assert chat is not None and claude is not None
    sent = dict(backend_headers(chat, "sk-real", caller, 12))
    assert sent == {b"Host": b"models.example.com", b"content-type": b"application/json",
                    b"anthropic-version": b"2023-06-01", b"authorization": b"Bearer sk-real",
                    b"content-length": b"12", b"accept-encoding": b"identity"}  # fmt: skip
    sent = dict(backend_headers(claude, "sk-real", caller[:1], 3))
    assert sent[b"x-api-key"] == b"sk-real" and b"authorization" not in sent and sent[b"Host"] == b"10.0.0.5:8443"


def test_models_are_listed_in_a_shape_both_sdks_read() -> None:
    routes = load_routes_text(GOOD, "routes.yaml")
    body = json.loads(models_body(list(routes.routes)))
    assert [m["id"] for m in body["data"]] == ["small", "large", "small"]
    assert body["object"] == "list" and body["has_more"] is False and body["first_id"] == "small"
    assert {"object", "owned_by", "type", "display_name", "created_at"} <= set(body["data"][0])


def _query(name: str, rdtype: str) -> dns.message.Message:
    return dns.message.make_query(name, rdtype)


def test_dns_answers_inference_local_itself_and_never_lets_local_names_leave() -> None:
    def plan(name: str, rdtype: str = "A", *, inference: bool = True) -> DnsAction:
        return plan_answer(_query(name, rdtype), eligible=lambda n: True, ipv6_egress=True, inference=inference).action

    assert plan("inference.local") is DnsAction.SYNTHETIC
    assert plan("INFERENCE.local.") is DnsAction.SYNTHETIC
    assert plan("inference.local", "AAAA") is DnsAction.NODATA
    assert plan("inference.local", "TXT") is DnsAction.NOTIMP
    # control's own name is never resolved or forwarded, even where a policy glob could allow it
    assert plan("x.inference.local") is DnsAction.REFUSED
    assert plan("inference.local", inference=False) is DnsAction.REFUSED
    assert plan("api.svc.cluster.local") is DnsAction.RESOLVE  # cluster names stay the policy's


def test_a_revision_replaces_the_routes_and_an_invalid_one_keeps_them(tmp_path: Path) -> None:
    creds = Credentials.from_mapping({"KEY": {"secret": "sk-live-1234", "hosts": []}})
    path = tmp_path / "routes.yaml"
    path.write_text(GOOD)
    store = RoutesStore(load_routes_text(GOOD, str(path)), creds, JsonLog("control", stream=None))
    unsafe: list[str | None] = [None]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: watch_routes_file(store, path, guard=lambda: unsafe[0], interval=0.01))
            path.write_text(GOOD.replace("models: [small, large]", "models: [small, large, huge]"))
            await await_until(lambda: store.generation >= 1, "the revision loaded")
            assert store.current.route_for(BackendKind.OPENAI, "huge") is not None
            path.write_text(GOOD.replace("kind: openai", "kind: nope"))
            await await_until(lambda: store.last_error is not None, "the invalid revision refused")
            assert store.generation == 1 and store.current.route_for(BackendKind.OPENAI, "huge") is not None
            unsafe[0] = "the agent can write it"
            path.write_text(GOOD)  # never read: the watch stops first
            await await_until(lambda: (store.watching or "").startswith("stopped"), "the watch stopped")
            assert store.current.route_for(BackendKind.OPENAI, "huge") is not None
            nursery.cancel_scope.cancel()

    trio.run(main)
