"""The real servers of the agent's-own-protocols e2e tests, over HTTPS on a test host: the official MCP SDK's
streamable-HTTP app, a strawberry GraphQL schema and a json-rpc dispatcher, each under uvicorn.

Run by Debian's /usr/bin/python3 with the test SDKs on PYTHONPATH (scripts/install-test-sdks.sh), never imported by
the test process::

    python3 protocol_servers.py mcp|graphql|jsonrpc ADDRESS PORT CERT KEY LOG

LOG gets one JSON line per HTTP request that reached the server (method, path, query, body as text), written
before the app sees it, and one per tool or method the app executed: that file is what the tests assert reached
the origin. The GraphQL server resolves hash-only persisted queries from its own registry (:data:`PERSISTED`),
as a server with automatic persisted queries does.
"""

# no `from __future__ import annotations`: the SDKs read the tools' and resolvers' annotations at run time
import hashlib
import json
import sys
import threading
from typing import Any

Scope = dict[str, Any]

_lock = threading.Lock()
LOG_PATH = ""


def log(**record: Any) -> None:
    with _lock, open(LOG_PATH, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def recorded(app: Any, rewrite: Any = None) -> Any:
    """``app`` behind a recorder of every request that reaches it (and an optional body rewrite)."""

    async def wrapped(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        body = await _read_body(receive)
        log(kind="http", method=scope["method"], path=scope["path"], query=scope["query_string"].decode(),
            body=body.decode("utf-8", "replace"))  # fmt: skip
        if rewrite is not None:
            body = rewrite(body)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return wrapped


def mcp_app() -> Any:
    from mcp.server import MCPServer
    from mcp.server.mcpserver import Context
    from mcp.types import SamplingMessage, TextContent

    server = MCPServer("protocols-e2e")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        log(kind="tool", name="add")
        return a + b

    @server.tool()
    async def ask_model(question: str, ctx: Context) -> str:
        """Ask the client's model (sampling: a server-to-client request answered by a client response frame)."""
        log(kind="tool", name="ask_model")
        result = await ctx.session.create_message(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text=question))], max_tokens=16
        )
        content = result.content
        return content.text if isinstance(content, TextContent) else repr(content)

    @server.tool()
    def delete_everything() -> str:
        """The tool the policy denies."""
        log(kind="tool", name="delete_everything")
        return "deleted"

    return recorded(server.streamable_http_app(streamable_http_path="/mcp", host="0.0.0.0"))


PERSISTED = {
    hashlib.sha256(doc.encode()).hexdigest(): doc for doc in ("query Hello { hello }", "query Secret { secret }")
}


def graphql_app() -> Any:
    import strawberry
    from strawberry.asgi import GraphQL

    @strawberry.type
    class Query:
        @strawberry.field
        def hello(self) -> str:
            log(kind="field", name="hello")
            return "world"

        @strawberry.field
        def secret(self) -> str:
            log(kind="field", name="secret")
            return "the secret"

    @strawberry.type
    class Mutation:
        @strawberry.mutation
        def delete_repo(self, name: str) -> bool:
            log(kind="field", name="deleteRepo")
            return True

    def persisted(body: bytes) -> bytes:
        try:
            request = json.loads(body)
        except ValueError:
            return body
        if isinstance(request, dict) and "query" not in request:
            digest = ((request.get("extensions") or {}).get("persistedQuery") or {}).get("sha256Hash")
            if digest in PERSISTED:
                request["query"] = PERSISTED[digest]
                return json.dumps(request).encode()
        return body

    schema = strawberry.Schema(query=Query, mutation=Mutation)
    return recorded(GraphQL(schema), persisted)


def jsonrpc_app() -> Any:
    from jsonrpc import Dispatcher, JSONRPCResponseManager

    dispatcher = Dispatcher()

    def method(name: str, value: Any) -> None:
        def run(*args: Any, **kwargs: Any) -> Any:
            log(kind="method", name=name)
            return value

        dispatcher.add_method(run, name)

    method("eth_blockNumber", "0x10")
    method("eth_getBalance", "0x0")
    method("eth_sendTransaction", "0xdead")

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        body = await _read_body(receive)
        response = JSONRPCResponseManager.handle(body.decode("utf-8", "replace"), dispatcher)
        payload = response.json.encode() if response is not None else b""
        await send({"type": "http.response.start", "status": 200 if payload else 204,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": payload})

    return recorded(app)


def main() -> None:
    global LOG_PATH
    kind, address, port, cert, key, LOG_PATH = sys.argv[1:7]
    import uvicorn

    app = {"mcp": mcp_app, "graphql": graphql_app, "jsonrpc": jsonrpc_app}[kind]()
    uvicorn.run(app, host=address, port=int(port), ssl_certfile=cert, ssl_keyfile=key, log_level="warning",
                lifespan="on" if kind == "mcp" else "off")  # fmt: skip


if __name__ == "__main__":
    main()
