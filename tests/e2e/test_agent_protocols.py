"""The agent's own protocols end to end in dev mode (model R, as root), with the real SDKs on both sides: the MCP
SDK's client and streamable-HTTP server, gql against strawberry, jsonrpcclient over requests against json-rpc
(tests/e2e/protocol_agents.py, protocol_servers.py; scripts/install-test-sdks.sh installs them).

The agent runs Debian's /usr/bin/python3 under its own uid; what each call returned, or the exception its SDK
raised and how long that took, comes back on its stdout. What reached each server is the server's own log, written
before the app sees a request: a refused call must be absent from it, and every refusal must be the SDK's ordinary
error for a 403, raised at once (no client hangs on a refusal).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns
from tests.waiting import wait_until

CLI = [sys.executable, "-m", "supervisor.cli"]
HERE = Path(__file__).parent
SDKS = Path(os.environ.get("OPENSHELL_TEST_SDKS", "/opt/openshell-test-sdks"))
SITE = SDKS / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
PORTS = {"mcp": 8443, "graphql": 8444, "jsonrpc": 8445}
NAMES = {"mcp": "mcp.test", "graphql": "graphql.test", "jsonrpc": "rpc.test"}
PATHS = {"mcp": "/mcp", "graphql": "/graphql", "jsonrpc": "/rpc"}
HELLO = "query Hello { hello }"
SECRET = "query Secret { secret }"
STEP_SECONDS = 10  # a refusal is answered at once; this bounds it generously for a busy machine

POLICY = """\
version: 1
network_policies:
  tools:
    name: an MCP server, two of its three tools
    endpoints:
      - host: mcp.test
        port: {mcp_port}
        path: /mcp
        protocol: mcp
        enforcement: enforce
        allowed_ips: ["{address}/32"]
        mcp: {{allow_all_known_mcp_methods: true}}
        rules:
          - allow: {{tool: {{any: [add, ask_model]}}}}
    binaries: &agent
      - path: /usr/bin/python3*
  graph:
    name: queries, not the secret field; one persisted query
    endpoints:
      - host: graphql.test
        port: {graphql_port}
        path: /graphql
        protocol: graphql
        enforcement: enforce
        allowed_ips: ["{address}/32"]
        access: read-only
        deny_rules:
          - {{operation_type: query, fields: [secret]}}
        persisted_queries: allow_registered
        graphql_persisted_queries:
          "{hello_hash}": {{operation_type: query, operation_name: Hello, fields: [hello]}}
    binaries: *agent
  node:
    name: a JSON-RPC node, read methods only
    endpoints:
      - host: rpc.test
        port: {jsonrpc_port}
        path: /rpc
        protocol: json-rpc
        enforcement: enforce
        allowed_ips: ["{address}/32"]
        rules:
          - allow: {{method: eth_blockNumber}}
          - allow: {{method: eth_getBalance}}
    binaries: *agent
"""


@dataclass
class World:
    host: NetnsHost
    dns: DnsServer
    root: Path
    policy: Path
    ca_file: Path
    runtime: str

    def log(self, kind: str) -> list[dict[str, Any]]:
        path = self.root / f"{kind}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Run:
    steps: dict[str, dict[str, Any]]
    seen: list[dict[str, Any]]  # what reached the server during the run
    events: list[dict[str, Any]]
    stderr: str

    def step(self, name: str) -> dict[str, Any]:
        assert name in self.steps, f"step {name!r} did not run: {self.stderr[-3000:]}"
        return self.steps[name]

    def refused(self, name: str, error_type: str) -> dict[str, Any]:
        """The step failed with exactly ``error_type``, at once."""
        step = self.step(name)
        assert not step["ok"], f"{name} was not refused: {step}"
        assert step["type"] == error_type, step
        assert step["seconds"] < STEP_SECONDS, f"{name}: the client waited {step['seconds']} s for its refusal"
        return step

    def bodies(self) -> list[str]:
        return [r["body"] for r in self.seen if r["kind"] == "http"]

    def executed(self) -> list[str]:
        return [r["name"] for r in self.seen if r["kind"] != "http"]

    def http_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "http"]


def _sdks_missing() -> str | None:
    probe = subprocess.run(["/usr/bin/python3", "-c", "import mcp, gql, strawberry, jsonrpc, jsonrpcclient, uvicorn"],
                           env={"PYTHONPATH": str(SITE), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    if probe.returncode != 0:
        return f"the test SDKs are not installed in {SDKS} (scripts/install-test-sdks.sh): {probe.stderr[-300:]}"
    return None


def _listening(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("the agent's interpreter is Debian's /usr/bin/python3")
    missing = _sdks_missing()
    if missing:
        pytest.skip(missing)
    root = Path(tempfile.mkdtemp(prefix="osb-proto-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        ca = trustme.CA()
        leaf = ca.issue_cert(*NAMES.values())
        cert, key, ca_file = root / "cert.pem", root / "key.pem", root / "ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(ca_file))
        shutil.copy(HERE / "protocol_servers.py", root / "protocol_servers.py")
        with open_test_host() as host:
            for kind, port in PORTS.items():
                host.popen(["/usr/bin/python3", str(root / "protocol_servers.py"), kind, host.address, str(port),
                            str(cert), str(key), str(root / f"{kind}.jsonl")],
                           env={"PYTHONPATH": str(SITE), "PATH": "/usr/bin:/bin"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            with DnsServer({name: [host.address] for name in NAMES.values()}) as dns:
                policy = root / "policy.yaml"
                ports = {f"{kind}_port": port for kind, port in PORTS.items()}
                hello_hash = hashlib.sha256(HELLO.encode()).hexdigest()
                policy.write_text(POLICY.format(address=host.address, hello_hash=hello_hash, **ports))
                subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
                for port in PORTS.values():
                    wait_until(lambda port=port: _listening(host.address, port), f"the server on port {port}")
                yield World(host, dns, root, policy, ca_file, runtime)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def run_agent(world: World, kind: str) -> Run:
    before = len(world.log(kind))
    url = f"https://{NAMES[kind]}:{PORTS[kind]}{PATHS[kind]}"
    # the agent's /tmp is its own: the client script travels in the command line
    code = base64.b64encode((HERE / "protocol_agents.py").read_bytes()).decode()
    script = f"echo {code} | base64 -d > /tmp/agent.py && PYTHONPATH={SITE} exec python3 /tmp/agent.py {kind} {url}"
    result = subprocess.run(
        [*CLI, "dev", "--log-format=json", f"--policy={world.policy}",
         f"--dns-server={world.dns.address[0]}:{world.dns.address[1]}", f"--upstream-ca={world.ca_file}",
         "--", "sh", "-c", script],
        capture_output=True, text=True, timeout=240, env={**os.environ, "XDG_RUNTIME_DIR": world.runtime},
    )  # fmt: skip
    steps = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            step = json.loads(line)
            steps[step["step"]] = step
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    return Run(steps, world.log(kind)[before:], events, result.stderr)


@pytest.fixture(scope="module")
def mcp_run(world: World) -> Run:
    return run_agent(world, "mcp")


@pytest.fixture(scope="module")
def graphql_run(world: World) -> Run:
    return run_agent(world, "graphql")


@pytest.fixture(scope="module")
def jsonrpc_run(world: World) -> Run:
    return run_agent(world, "jsonrpc")


# MCP


def test_mcp_allowed_tools_work_end_to_end(mcp_run: Run) -> None:
    assert mcp_run.step("tools/list")["value"] == ["add", "ask_model", "delete_everything"], mcp_run.stderr[-3000:]
    assert mcp_run.step("add")["value"] == ["5"]
    assert mcp_run.step("add again")["value"] == ["9"], "the session outlives a refused call"
    assert mcp_run.executed().count("add") == 2


def test_mcp_sampling_reply_and_event_stream_pass(mcp_run: Run) -> None:
    """The server's sampling request reaches the client on the POST's event stream and its reply, a client-to-server
    response frame, reaches the server; the client's GET stream reached the server too."""
    assert mcp_run.step("ask_model")["value"] == ["sampled: 42"], mcp_run.stderr[-3000:]
    replies = [json.loads(b) for b in mcp_run.bodies() if b.startswith("{") and '"result"' in b]
    assert any(r.get("result", {}).get("model") == "agent-model" for r in replies)
    assert any(r["method"] == "GET" for r in mcp_run.seen if r["kind"] == "http"), "the SSE stream reached the server"


def test_mcp_denied_tool_is_the_sdks_error_and_never_reaches_the_server(mcp_run: Run) -> None:
    step = mcp_run.refused("delete_everything", "mcp.shared.exceptions.MCPError")
    assert step["code"] == -32603 and "Server returned an error response" in step["error"]
    assert "delete_everything" not in mcp_run.executed()
    assert not [b for b in mcp_run.bodies() if "delete_everything" in b]
    denied = [e for e in mcp_run.http_events() if e.get("decision") == "deny"]
    assert [e.get("operation") for e in denied][:1] == ["tools/call delete_everything"], denied


def test_mcp_batch_with_a_denied_call_is_denied_whole(mcp_run: Run) -> None:
    batch = mcp_run.step("batch")["value"]
    assert batch["status"] == 403 and batch["error"] == "policy_denied", batch
    assert not [b for b in mcp_run.bodies() if b.startswith("[") and "delete_everything" in b]
    allowed = mcp_run.step("batch allowed")["value"]
    assert allowed["status"] != 403, "a batch of allowed calls passes control (the server then judges it itself)"
    assert [b for b in mcp_run.bodies() if b.startswith("[")], "the allowed batch reached the server"


# GraphQL


def test_graphql_query_allowed(graphql_run: Run) -> None:
    assert graphql_run.step("query")["value"] == {"hello": "world"}, graphql_run.stderr[-3000:]
    assert graphql_run.step("query again")["value"] == {"hello": "world"}


def test_graphql_mutation_denied_with_nothing_at_the_server(graphql_run: Run) -> None:
    step = graphql_run.refused("mutation", "gql.transport.exceptions.TransportServerError")
    assert step["code"] == 403, step
    assert "deleteRepo" not in graphql_run.executed()
    assert not [b for b in graphql_run.bodies() if "deleteRepo" in b]


def test_graphql_hidden_denied_fields_denied(graphql_run: Run) -> None:
    """An alias, a fragment, or an operationName naming the harmless operation of two: none hides what executes."""
    for name in ("aliased secret", "fragment secret", "operationName picks another"):
        assert graphql_run.refused(name, "gql.transport.exceptions.TransportServerError")["code"] == 403
    assert not {"secret", "deleteRepo"} & set(graphql_run.executed())
    assert not [b for b in graphql_run.bodies() if "secret" in b or "deleteRepo" in b]


def test_graphql_persisted_query_only_when_registered(graphql_run: Run) -> None:
    assert graphql_run.step("persisted registered")["value"] == {"hello": "world"}, graphql_run.stderr[-3000:]
    graphql_run.refused("persisted unregistered", "gql.transport.exceptions.TransportServerError")
    secret_hash = hashlib.sha256(SECRET.encode()).hexdigest()
    assert not [b for b in graphql_run.bodies() if secret_hash in b]
    assert any(hashlib.sha256(HELLO.encode()).hexdigest() in b for b in graphql_run.bodies())


# JSON-RPC


def test_jsonrpc_read_allowed_write_denied(jsonrpc_run: Run) -> None:
    assert jsonrpc_run.step("read")["value"] == "Ok(result='0x10', id=1)", jsonrpc_run.stderr[-3000:]
    assert jsonrpc_run.step("read again")["value"].startswith("Ok(result='0x10'")
    step = jsonrpc_run.refused("write", "requests.exceptions.HTTPError")
    assert "403" in step["error"]
    assert "eth_sendTransaction" not in jsonrpc_run.executed()


def test_jsonrpc_mixed_batch_denied_whole(jsonrpc_run: Run) -> None:
    jsonrpc_run.refused("batch", "requests.exceptions.HTTPError")
    assert jsonrpc_run.step("batch allowed")["value"] == ["Ok(result='0x0', id=5)", "Ok(result='0x10', id=6)"]
    assert not [b for b in jsonrpc_run.bodies() if "eth_sendTransaction" in b]
    assert jsonrpc_run.executed().count("eth_getBalance") == 1, "only the allowed batch executed"


def test_jsonrpc_malformed_bodies_refused(jsonrpc_run: Run) -> None:
    """Bodies the server would read differently from control (json-rpc takes the last "method", decodes escapes) or
    not at all: each refused by control, none at the server."""
    for name in ("duplicate method", "escaped name", "not json", "no method", "not utf-8"):
        assert "403" in jsonrpc_run.refused(name, "requests.exceptions.HTTPError")["error"]
    assert jsonrpc_run.executed().count("eth_blockNumber") == 3  # read, the allowed batch, read again
    assert len(jsonrpc_run.bodies()) == 3
