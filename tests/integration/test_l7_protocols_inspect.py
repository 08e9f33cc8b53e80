"""The agent's own protocols on the inspected path (``inspect``), from the attacker's side: a real TLS client plays
the agent, a real HTTPS origin records what reached it. JSON-RPC, MCP and GraphQL bodies are read whole, judged,
and forwarded as judged; a refusal is the spec's 403 ``policy_denied`` with ``X-OpenShell-Policy`` and
``Connection: close``, and nothing of it reaches the origin."""

from __future__ import annotations

import io
import json
import ssl

import pytest
import trio
import trustme

from supervisor.control.credentials import Credentials
from supervisor.control.policy import PolicyStore, compile_policy, load_policy_text

from .test_l7_inspect import _CA, Env, Origin, agent_socket, raw_exchange, tls_calls

POLICY = """
version: 1
network_policies:
  tools:
    endpoints:
      - host: api.test
        port: 443
        path: /mcp
        protocol: mcp
        enforcement: enforce
        mcp: {allow_all_known_mcp_methods: true, max_body_bytes: 4096}
        rules:
          - allow: {tool: {any: [echo, read_file]}}
      - host: api.test
        port: 443
        path: /rpc
        protocol: json-rpc
        enforcement: enforce
        rules:
          - allow: {method: eth_blockNumber}
      - host: api.test
        port: 443
        path: /graphql
        protocol: graphql
        enforcement: enforce
        access: read-only
      - host: api.test
        port: 443
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {method: POST, path: "**"}
    binaries: [{path: /usr/bin/curl}]
"""
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def env(nursery: trio.Nursery) -> Env:
    authority = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("api.test").configure_cert(server_ctx)
    tls_origin, plain_origin = Origin(server_ctx), Origin(None)
    await tls_origin.start(nursery)
    await plain_origin.start(nursery)
    store = PolicyStore(compile_policy(load_policy_text(POLICY, "test.yaml")), source="test.yaml")
    return Env(tls_origin, plain_origin, _CA, authority, store, Credentials.from_mapping({}), io.StringIO())


def rpc(method: str, i: int = 1, **params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode()


async def test_mcp_allowed_tool_reaches_the_server_denied_one_does_not(env: Env) -> None:
    calls = [("POST", "/mcp", JSON, rpc("tools/list")),
             ("POST", "/mcp", JSON, rpc("tools/call", 2, name="echo", arguments={"text": "hi"})),
             ("POST", "/mcp", JSON, rpc("tools/call", 3, name="delete_everything",
                                        arguments={"token": "s3cr3t"}))]  # fmt: skip
    replies, stats = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200, 200, 403]
    assert [json.loads(s.body)["params"].get("name") for s in env.tls_origin.requests] == [None, "echo"]
    denied = replies[2]
    assert denied.headers["x-openshell-policy"] == "tools" and denied.headers["connection"] == "close"
    assert denied.json()["error"] == "policy_denied"
    assert "tools/call delete_everything" in denied.json()["detail"]
    events = env.events()
    assert [e.get("operation") for e in events] == ["tools/list", "tools/call echo", "tools/call delete_everything"]
    assert "s3cr3t" not in env.log.getvalue() and '"hi"' not in env.log.getvalue()  # arguments are never logged
    assert replies[1].json()["body_len"] == len(calls[1][3])  # forwarded as read
    assert stats.denied == 1


async def test_mcp_mixed_batch_and_oversized_body_never_arrive(env: Env) -> None:
    batch = b"[" + rpc("tools/call", 1, name="echo") + b"," + rpc("tools/call", 2, name="rm") + b"]"
    replies, _ = await env.run(tls_calls(env, [("POST", "/mcp", JSON, batch)]))
    assert replies[0].status == 403 and not env.tls_origin.requests
    big = rpc("tools/call", 1, name="echo", arguments={"text": "x" * 5000})
    replies, _ = await env.run(tls_calls(env, [("POST", "/mcp", JSON, big)]))
    assert replies[0].status == 403 and "limit of 4096 bytes" in replies[0].json()["detail"]
    assert not env.tls_origin.requests


async def test_a_call_split_across_chunks_is_judged_whole(env: Env) -> None:
    body = rpc("tools/call", 1, name="delete_everything")
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7))

    def client(port: int) -> bytes:
        sock = agent_socket(port, env.ca.cert_pem)
        head = (b"POST /mcp HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: application/json\r\n\r\n")  # fmt: skip
        return raw_exchange(sock, head + chunks + b"0\r\n\r\n")

    reply, _ = await env.run(client)
    assert reply.startswith(b"HTTP/1.1 403 ") and not env.tls_origin.requests


async def test_jsonrpc_and_graphql_through_inspection(env: Env) -> None:
    calls = [("POST", "/rpc", JSON, rpc("eth_blockNumber")),
             ("POST", "/graphql", JSON, json.dumps({"query": "{ viewer { login } }"}).encode()),
             ("POST", "/graphql", JSON,
              json.dumps({"query": "mutation { deleteRepository(id: 1) { id } }"}).encode())]  # fmt: skip
    replies, _ = await env.run(tls_calls(env, calls))
    assert [r.status for r in replies] == [200, 200, 403]
    assert [s.target for s in env.tls_origin.requests] == ["/rpc", "/graphql"]  # REST's POST ** allows no mutation
    replies, _ = await env.run(tls_calls(env, [("POST", "/rpc", JSON, rpc("eth_sendTransaction"))]))
    assert replies[0].status == 403 and len(env.tls_origin.requests) == 2


async def test_expect_continue_on_a_body_endpoint(env: Env) -> None:
    body = rpc("eth_blockNumber")

    def client(port: int) -> bytes:
        sock = agent_socket(port, env.ca.cert_pem)
        sock.sendall(b"POST /rpc HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"
                     % len(body))  # fmt: skip
        interim = sock.recv(4096)
        return interim + raw_exchange(sock, body)

    reply, _ = await env.run(client)
    assert reply.startswith(b"HTTP/1.1 100 ") and b"HTTP/1.1 200 " in reply
    assert env.tls_origin.requests[0].body == body and "expect" not in env.tls_origin.requests[0].headers
