"""HTTPS inspection end to end in dev mode: real clients trust the per-sandbox CA through the
environment alone; L7 rules per request; a placeholder becomes the secret only toward its bound host (asserted
at the origin); domain fronting and smuggling refused, with nothing reaching the origin.
"""

from __future__ import annotations

import json
import os
import shutil
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

CLI = [sys.executable, "-m", "supervisor.cli"]
RECORDER = Path(__file__).parent.parent / "https_recorder.py"
PORT = 8443
SECRET = "s3cr3t-value-9f2c1"

POLICY = """\
version: 1
network_policies:
  secure-api:
    name: GET only, where the token is bound
    endpoints:
      - host: secure.test
        port: {port}
        protocol: rest
        enforcement: enforce
        allowed_ips: ["{address}/32"]
        rules:
          - allow: {{method: GET, path: "/**"}}
    binaries: &clients
      - path: /usr/bin/curl
      - path: /usr/bin/python3*
      - path: /usr/lib/git-core/git-remote-http
  plain-api:
    name: no L7 rules, but a credential is bound here
    endpoints:
      - host: plain.test
        port: {port}
        allowed_ips: ["{address}/32"]
    binaries: *clients
  other-api:
    name: everything, but the token is not bound here
    endpoints:
      - host: other.test
        port: {port}
        protocol: rest
        enforcement: enforce
        allowed_ips: ["{address}/32"]
        rules:
          - allow: {{method: "*", path: "/**"}}
    binaries: *clients
"""

CREDENTIALS = f"""\
API_TOKEN:
  secret: {SECRET}
  hosts: ["secure.test"]
PLAIN_TOKEN:
  secret: {SECRET}-plain
  hosts: ["plain.test"]
"""


@dataclass
class Origin:
    host: NetnsHost
    dns: DnsServer
    log: Path
    policy: Path
    credentials: Path
    ca_file: Path
    runtime: str

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def dev(
        self,
        script: str,
        *,
        credentials: Path | None = None,
        upstream_ca: bool = True,
        env: dict[str, str] | None = None,
        log_format: str = "json",
    ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
        trust = [f"--upstream-ca={self.ca_file}"] if upstream_ca else []
        result = subprocess.run(
            [*CLI, "dev", f"--log-format={log_format}", f"--policy={self.policy}",
             f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}",
             f"--credentials={credentials or self.credentials}", *trust, "--", "sh", "-c", script],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "XDG_RUNTIME_DIR": self.runtime, **(env or {})},
        )  # fmt: skip
        events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        return result, events


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    root = Path(tempfile.mkdtemp(prefix="osb-l7-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        ca = trustme.CA()
        leaf = ca.issue_cert("secure.test", "other.test", "plain.test")
        cert, key, ca_file = root / "cert.pem", root / "key.pem", root / "ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(ca_file))
        www = root / "www"
        www.mkdir()
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
        subprocess.run([*git, "init", "-q", str(root / "work")], check=True)
        (root / "work" / "README").write_text("cloned through inspection\n")
        subprocess.run([*git, "-C", str(root / "work"), "add", "README"], check=True)
        subprocess.run([*git, "-C", str(root / "work"), "commit", "-qm", "first"], check=True)
        subprocess.run(["git", "clone", "-q", "--bare", str(root / "work"), str(www / "repo.git")], check=True)
        subprocess.run(["git", "-C", str(www / "repo.git"), "update-server-info"], check=True)
        log = root / "requests.jsonl"
        with open_test_host() as host:
            host.popen([sys.executable, str(RECORDER), host.address, str(PORT), str(cert), str(key), str(log)],
                       env={**os.environ, "RECORDER_ROOT": str(www)},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            names = {name: [host.address] for name in ("secure.test", "other.test", "plain.test")}
            with DnsServer(names) as dns:
                policy, credentials = root / "policy.yaml", root / "credentials.yaml"
                policy.write_text(POLICY.format(port=PORT, address=host.address))
                credentials.write_text(CREDENTIALS)
                subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
                _wait(host.address)
                yield Origin(host, dns, log, policy, credentials, ca_file, runtime)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _wait(address: str) -> None:
    import socket
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the HTTPS origin did not come up")


def test_clients_trust_the_ca_and_rules_apply_per_request(origin: Origin) -> None:
    before = len(origin.requests())
    url = f"https://secure.test:{PORT}"
    script = "; ".join([
        f"curl -sS -f {url}/plain && echo",
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' -X POST -d x {url}/write",
        f"python3 -c \"import requests; print(requests.get('{url}/py', timeout=10).json()['path'])\"",
        f"cd /tmp && git clone -q {url}/repo.git l7-$$ && cat l7-$$/README && rm -rf l7-$$",
    ])  # fmt: skip
    result, _events = origin.dev(script)
    lines = result.stdout.splitlines()
    assert lines[0] == '{"ok": true, "method": "GET", "path": "/plain"}', result.stderr[-3000:]
    assert lines[1] == "403"
    assert lines[2] == "/py"
    assert lines[3] == "cloned through inspection"
    seen = origin.requests()[before:]
    assert all(r["method"] == "GET" for r in seen), "the denied POST must not reach the origin"
    assert any(r["path"] == "/py" for r in seen) and any(r["path"].startswith("/repo.git") for r in seen)


def test_placeholder_becomes_the_secret_only_where_bound(origin: Origin) -> None:
    before = len(origin.requests())
    script = "; ".join([
        "echo \"$API_TOKEN\"",
        f"curl -sS -f -H \"Authorization: Bearer $API_TOKEN\" https://secure.test:{PORT}/bound && echo",
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' -H \"Authorization: Bearer $API_TOKEN\" "
        f"https://other.test:{PORT}/unbound",
    ])  # fmt: skip
    result, _events = origin.dev(script)
    lines = result.stdout.splitlines()
    assert SECRET not in result.stdout and lines[0].startswith("openshell:resolve:env:"), "the agent sees a placeholder"
    assert lines[2] == "403", result.stderr[-3000:]
    seen = origin.requests()[before:]
    bound = [r for r in seen if r["path"] == "/bound"]
    assert [r["authorization"] for r in bound] == [f"Bearer {SECRET}"]
    assert not any(r["path"] == "/unbound" for r in seen), "nothing may reach the unbound host"
    assert SECRET not in result.stderr, "the secret must never appear in events or logs"


def test_control_reads_what_it_documents_from_its_environment(origin: Origin, tmp_path: Path) -> None:
    """Control's environment is composed (docs/design.md "Our own interpreters"): a ``secret_env`` credential and
    ``SSL_CERT_FILE`` as upstream trust still reach it from dev's environment."""
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text('API_TOKEN:\n  secret_env: OSB_TEST_TOKEN\n  hosts: ["secure.test"]\n')
    credentials.chmod(0o644)
    before = len(origin.requests())
    script = f'curl -sS -f -H "Authorization: Bearer $API_TOKEN" https://secure.test:{PORT}/from-env && echo'
    env = {"OSB_TEST_TOKEN": f"{SECRET}-env", "SSL_CERT_FILE": str(origin.ca_file)}
    result, _events = origin.dev(script, credentials=credentials, upstream_ca=False, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith('{"ok": true'), result.stdout
    seen = [r for r in origin.requests()[before:] if r["path"] == "/from-env"]
    assert [r["authorization"] for r in seen] == [f"Bearer {SECRET}-env"], "the secret_env variable reached control"


def test_domain_fronting_and_smuggling_are_refused(origin: Origin) -> None:
    before = len(origin.requests())
    smuggle = (
        "import socket, ssl, os\n"
        "s = socket.create_connection(('127.0.0.1', 3128))\n"
        f"s.sendall(b'CONNECT secure.test:{PORT} HTTP/1.1\\r\\nHost: secure.test:{PORT}\\r\\n\\r\\n')\n"
        "assert b' 200 ' in s.recv(4096)\n"
        "ctx = ssl.create_default_context(cafile=os.environ['SSL_CERT_FILE'])\n"
        "t = ctx.wrap_socket(s, server_hostname='secure.test')\n"
        f"t.sendall(b'GET /smuggled HTTP/1.1\\r\\nHost: secure.test:{PORT}\\r\\nContent-Length: 4\\r\\n"
        "Transfer-Encoding: chunked\\r\\n\\r\\n0\\r\\n\\r\\n')\n"
        "answer = t.recv(4096)\n"
        "print(answer.split(b'\\r\\n')[0].decode() if answer else 'closed')\n"
    )
    script = "; ".join([
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'Host: other.test:{PORT}' "
        f"-H \"Authorization: Bearer $API_TOKEN\" https://secure.test:{PORT}/fronted",
        f"python3 -c \"{smuggle}\"",
    ])  # fmt: skip
    result, _events = origin.dev(script)
    lines = result.stdout.splitlines()
    assert lines[0] in ("421", "403"), result.stderr[-3000:]
    assert lines[1].startswith("HTTP/1.1 400") or lines[1] == "closed", result.stderr[-3000:]
    seen = origin.requests()[before:]
    assert not any(r["path"] in ("/fronted", "/smuggled") for r in seen)
    assert not any(SECRET in (r["authorization"] or "") for r in seen)


def test_credentials_are_injected_on_an_endpoint_without_l7_rules(origin: Origin) -> None:
    """Where a credential is bound, the connection is inspected even though the endpoint has no rules: the
    placeholder must not leave unresolved (and the secret still only goes to its bound host)."""
    before = len(origin.requests())
    result, _events = origin.dev(
        f'curl -sS -f -H "X-Api-Key: $PLAIN_TOKEN" https://plain.test:{PORT}/plain-bound && echo'
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [r for r in origin.requests()[before:] if r["path"] == "/plain-bound"]
    assert [r["x_api_key"] for r in seen] == [f"{SECRET}-plain"]


def test_an_echoing_bound_origin_never_hands_curl_the_secret(origin: Origin) -> None:
    """The origin echoes the injected secret in its reason phrase, a ``103`` head, a header name, and serves the
    stored echo in ``Range`` slices each shorter than the secret, or gzipped: curl never reads the secret."""
    before = len(origin.requests())
    url = f"https://secure.test:{PORT}/echo"
    doc = f"token={SECRET};"
    cut = doc.index(SECRET) + len(SECRET) // 2
    script = "; ".join([
        f'curl -sS -i -H "X-Api-Key: $API_TOKEN" {url}/reason; echo',
        f'curl -sS -i -H "X-Api-Key: $API_TOKEN" {url}/hints; echo',
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' -H \"X-Api-Key: $API_TOKEN\" {url}/name",
        f"curl -sS -r 0-{cut - 1} {url}/doc; echo",
        f"curl -sS -r {cut}-{len(doc) - 1} {url}/doc; echo",
        f"curl -sS --compressed {url}/doc; echo",
    ])  # fmt: skip
    result, events = origin.dev(script)
    out = result.stdout
    placeholder = "openshell:resolve:env:API_TOKEN"
    assert SECRET not in out and SECRET not in result.stderr, out
    half = len(SECRET) // 2
    assert not any(SECRET[i : i + half] in out for i in range(len(SECRET) - half + 1)), out
    assert f"200 OK {placeholder}" in out, out
    assert f"</{placeholder}>" in out, out  # the 103's Link, scrubbed
    lines = out.splitlines()
    assert "502" in lines, result.stderr[-3000:]  # the header name: refused, not forwarded
    assert lines[-3:] == [f"token={placeholder};"] * 3, out  # two slices asked, whole answers; one uncompressed
    docs = [r for r in origin.requests()[before:] if r["path"] == "/echo/doc"]
    assert [(r["range"], r["accept_encoding"]) for r in docs] == [(None, "identity")] * 3
    refused = [e for e in events if e.get("event") == "http" and e.get("status") == 502]
    assert [e["reason"] for e in refused] == ["secret-in-header-name"], refused


@pytest.mark.parametrize("log_format", ["json", "ocsf"])
def test_no_secret_placeholder_credential_name_query_or_body_reaches_an_event(origin: Origin, log_format: str) -> None:
    """Attacker's side (docs/reference/policy.md §4.1): the agent puts its placeholder in a header, a path, a query
    and a body, sends a body to a GET-only endpoint and its credential to a host it is not bound to, and names an
    executable after the placeholder. The requests that are allowed reach the origin with the secret; no event of
    either format, on the stream or in the events file, holds the secret, a placeholder, a credential's name, a
    query string or a body."""
    states = Path(os.environ["XDG_STATE_HOME"], "openshell-sandbox")
    files_before = set(states.glob("*/events.jsonl"))
    before = len(origin.requests())
    query, body = "q-marker-5d1e", "body-marker-77ab"
    # The agent's command line is the operator's (lifecycle events name it): the script spells none of what is
    # looked for, it builds the strings when it runs.
    script = "; ".join([
        'T=$(printenv API_TOK""EN); P=$(printenv PLAIN_TOK""EN)',
        "Q=$(printf 'q-mar%s' 'ker-5d1e'); B=$(printf 'body-mar%s' 'ker-77ab')",
        f'curl -sS -f -o /dev/null -H "Authorization: Bearer $T" "https://secure.test:{PORT}/r/$T/x?q=$Q&t=$T"',
        f'curl -s -o /dev/null -X POST --data "$B" "https://secure.test:{PORT}/write?q=$Q"',
        f'curl -s -o /dev/null -X POST --data "$B-$T" "https://other.test:{PORT}/post?q=$Q"',
        f'curl -s -o /dev/null -H "X-Api-Key: $P" "https://other.test:{PORT}/unbound?q=$Q"',
        f'cp /usr/bin/curl "$PWD/$T" && "$PWD/$T" -s -o /dev/null "https://plain.test:{PORT}/"',
        "echo done",
    ])  # fmt: skip
    assert not any(marker in script for marker in ("API_TOKEN", "PLAIN_TOKEN", query, body))
    result, events = origin.dev(script, log_format=log_format)
    assert result.stdout == "done\n", result.stderr[-3000:]
    seen = origin.requests()[before:]
    assert [r["path"] for r in seen if r["path"].startswith("/r/")] == [f"/r/{SECRET}/x?q={query}&t={SECRET}"]
    assert [(r["path"], r["body"]) for r in seen if r["path"].startswith("/post")] == [
        (f"/post?q={query}", len(body) + 1 + len("openshell:resolve:env:API_TOKEN"))]  # fmt: skip
    assert not any(r["path"].startswith(("/write", "/unbound")) for r in seen), "refused requests never left"
    [events_file] = set(states.glob("*/events.jsonl")) - files_before
    logged = {"stream": result.stderr, "events file": events_file.read_text()}
    for where, text in logged.items():
        for forbidden in (SECRET, "openshell:resolve:env:", "API_TOKEN", "PLAIN_TOKEN", query, body):
            assert forbidden not in text, f"{forbidden!r} in the {where} ({log_format})"
    http = [e for e in json_lines(logged["events file"]) if e["event"] == "http"]
    assert {(e["path"], e.get("injected")) for e in http if e["decision"] == "allow"} >= {("/r/[CREDENTIAL]/x", 1)}
    assert any(e.get("binary", "").endswith("/[CREDENTIAL]") for e in json_lines(logged["events file"]))
    if log_format == "ocsf":
        classes = {(e["class_uid"], e.get("action_id")) for e in events}
        assert {(4002, 1), (4002, 2), (2004, 2), (4001, 2)} <= classes, classes
        assert all("class_uid" in e for e in events)  # OCSF on the stream, nothing else


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
