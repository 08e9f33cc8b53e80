"""The agent's side of the agent's-own-protocols e2e tests: real clients (the MCP SDK, gql, jsonrpcclient over
requests) run inside the sandbox by Debian's /usr/bin/python3 under the agent's uid, with the test SDKs on
PYTHONPATH::

    python3 protocol_agents.py mcp|graphql|jsonrpc URL

Each step prints one JSON line ``{"step", "ok", "value" | "error", "type", "seconds"}``: the value returned, or the
exception the SDK raised (its class, qualified by module) and how long the call took, so the test can assert the
exact refusal and that no call hung. Every step is bounded (:data:`STEP_SECONDS`), so a hang is a failed step,
never a stuck test.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

STEP_SECONDS = 30


def report(step: str, started: float, value: Any = None, error: BaseException | None = None) -> None:
    line: dict[str, Any] = {"step": step, "ok": error is None, "seconds": round(time.monotonic() - started, 3)}
    if error is None:
        line["value"] = value
    else:
        line["type"] = f"{type(error).__module__}.{type(error).__qualname__}"
        line["error"] = str(error)[:500]
        code = getattr(error, "code", None)
        if isinstance(code, int):
            line["code"] = code
    print(json.dumps(line), flush=True)


def sync_step(step: str, fn: Callable[[], Any]) -> Any:
    started = time.monotonic()
    try:
        value = fn()
    except Exception as exc:  # the test asserts which one
        report(step, started, error=exc)
        return None
    report(step, started, value)
    return value


async def async_step(step: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    import anyio

    started = time.monotonic()
    try:
        with anyio.fail_after(STEP_SECONDS):
            value = await fn()
    except Exception as exc:  # TimeoutError when it hung
        report(step, started, error=exc)
        return None
    report(step, started, value)
    return value


# MCP: the SDK's Client over streamable HTTP, handshake-era protocol (initialize); the batch by hand, since the SDK
# never sends one


async def mcp_agent(url: str) -> None:
    from mcp import Client
    from mcp.types import CreateMessageResult, TextContent

    async def sampling(context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="sampled: 42"),
                                   model="agent-model", stop_reason="endTurn")  # fmt: skip

    def text(result: Any) -> Any:
        if result.is_error:
            return {"is_error": True, "text": [c.text for c in result.content if isinstance(c, TextContent)]}
        return [c.text for c in result.content if isinstance(c, TextContent)]

    async with Client(url, mode="legacy", sampling_callback=sampling, read_timeout_seconds=STEP_SECONDS) as client:
        await async_step("tools/list", lambda: _names(client))
        await async_step("add", lambda: _call(client, "add", {"a": 2, "b": 3}, text))
        await async_step("ask_model", lambda: _call(client, "ask_model", {"question": "six times seven?"}, text))
        await async_step("delete_everything", lambda: _call(client, "delete_everything", {}, text))
        await async_step("add again", lambda: _call(client, "add", {"a": 4, "b": 5}, text))
    sync_step("batch", lambda: _mcp_batch(url, [("add", {"a": 1, "b": 1}), ("delete_everything", {})]))
    sync_step("batch allowed", lambda: _mcp_batch(url, [("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2})]))


async def _names(client: Any) -> list[str]:
    return sorted(tool.name for tool in (await client.list_tools()).tools)


async def _call(client: Any, name: str, arguments: dict[str, Any], text: Callable[[Any], Any]) -> Any:
    return text(await client.call_tool(name, arguments))


def _mcp_batch(url: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """A JSON-RPC batch of tools/call in an initialised session; the status and body control or the server gave."""
    import requests

    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with requests.Session() as http:
        init = http.post(url, headers=accept, timeout=STEP_SECONDS, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "batch", "version": "1"}},
        })  # fmt: skip
        init.raise_for_status()
        session = {**accept, "Mcp-Session-Id": init.headers["mcp-session-id"]}
        http.post(url, headers=session, timeout=STEP_SECONDS,
                  json={"jsonrpc": "2.0", "method": "notifications/initialized"}).raise_for_status()  # fmt: skip
        batch = [{"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": {"name": name, "arguments": args}}
                 for i, (name, args) in enumerate(calls)]  # fmt: skip
        response = http.post(url, headers=session, json=batch, timeout=STEP_SECONDS)
        return {"status": response.status_code, "error": _json_field(response, "error")}


def _json_field(response: Any, name: str) -> Any:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get(name) if isinstance(body, dict) else None


# GraphQL: gql's requests transport; a hash-only persisted query is a GraphQLRequest whose payload has no document


def graphql_agent(url: str) -> None:
    import hashlib

    from gql import Client, GraphQLRequest, gql
    from gql.transport.requests import RequestsHTTPTransport

    class Persisted(GraphQLRequest):
        def __init__(self, document: str) -> None:
            super().__init__(document)
            self.digest = hashlib.sha256(document.encode()).hexdigest()

        @property
        def payload(self) -> dict[str, Any]:
            return {"extensions": {"persistedQuery": {"version": 1, "sha256Hash": self.digest}}}

    transport = RequestsHTTPTransport(url=url, timeout=STEP_SECONDS, retries=0)
    with Client(transport=transport, fetch_schema_from_transport=False) as session:
        sync_step("query", lambda: session.execute(gql("query Hello { hello }")))
        sync_step("mutation", lambda: session.execute(gql('mutation Drop { deleteRepo(name: "x") }')))
        sync_step("aliased secret", lambda: session.execute(gql("query Innocent { hello harmless: secret }")))
        sync_step("fragment secret", lambda: session.execute(
            gql("query Frag { ...F } fragment F on Query { hello secret }")))  # fmt: skip
        sync_step("operationName picks another", lambda: session.execute(
            gql("query A { hello } mutation B { deleteRepo(name: \"x\") }"), operation_name="A"))  # fmt: skip
        sync_step("persisted registered", lambda: transport.execute(Persisted("query Hello { hello }")).data)
        sync_step("persisted unregistered", lambda: transport.execute(Persisted("query Secret { secret }")).data)
        sync_step("query again", lambda: session.execute(gql("query Hello { hello }")))


# JSON-RPC: jsonrpcclient builds and parses the messages, requests carries them (raise_for_status on a refusal)


def jsonrpc_agent(url: str) -> None:
    import requests
    from jsonrpcclient import parse, request

    def call(body: Any, *, raw: bytes | None = None) -> Any:
        if raw is not None:
            response = requests.post(url, data=raw, headers={"Content-Type": "application/json"},
                                     timeout=STEP_SECONDS)  # fmt: skip
        else:
            response = requests.post(url, json=body, timeout=STEP_SECONDS)
        response.raise_for_status()
        answer = response.json()
        return [repr(p) for p in parse(answer)] if isinstance(answer, list) else repr(parse(answer))

    sync_step("read", lambda: call(request("eth_blockNumber")))
    sync_step("write", lambda: call(request("eth_sendTransaction", params=[{"to": "0x0"}])))
    sync_step("batch", lambda: call([request("eth_getBalance", params=["0x0"]), request("eth_sendTransaction")]))
    sync_step("batch allowed", lambda: call([request("eth_getBalance", params=["0x0"]), request("eth_blockNumber")]))
    malformed = {
        "duplicate method": b'{"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", '
        b'"method": "eth_sendTransaction"}',
        "escaped name": b'{"jsonrpc": "2.0", "id": 1, "method": "eth_send\\u0054ransaction"}',
        "not json": b'{"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"',
        "no method": b'{"jsonrpc": "2.0", "id": 1}',
        "not utf-8": b'{"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "x": "\xff"}',
    }
    for name, raw in malformed.items():
        sync_step(name, lambda raw=raw: call(None, raw=raw))
    sync_step("read again", lambda: call(request("eth_blockNumber")))


def main() -> None:
    kind, url = sys.argv[1], sys.argv[2]
    if kind == "mcp":
        import anyio

        anyio.run(mcp_agent, url)
    elif kind == "graphql":
        graphql_agent(url)
    else:
        jsonrpc_agent(url)


if __name__ == "__main__":
    main()
