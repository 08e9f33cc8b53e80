"""inference.local end to end in dev mode (model R, as root): the official openai and anthropic SDKs and curl in the
agent, with a dummy key, against a test model server on a test host that checks the key control injects.

The agent gets answers (chat, streaming, embeddings, model listings) without ever holding the backend's key; the
backend sees the route's key and never the agent's; a path outside the request shapes, a model outside the
routes and a route the program is not named in are refused with nothing reaching the backend; a backend that
stalls mid-stream is cut at the idle bound and the SDK raises an error; the key a backend echoes reaches the agent
as its placeholder.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.netns_hosts import DnsServer, open_test_host, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
BACKEND = Path(__file__).parent.parent / "inference_backend.py"
SDKS = Path(os.environ.get("OPENSHELL_INFERENCE_SDKS", "/opt/openshell-inference-sdks"))
PORT = 8443
KEY = "sk-backend-real-7f3a9c2e41"
DUMMY = "dummy-agent-key-0b1d"
IDLE = 3

ROUTES = """\
version: 1
routes:
  local-openai:
    kind: openai
    base_url: https://models.test:{port}/v1
    credential: MODEL_KEY
    models: [test-chat, test-embed, stall, echo-key]
    model_rewrite: {{test-chat: backend-chat}}
    allowed_ips: ["{address}/32"]
  local-anthropic:
    kind: anthropic
    base_url: https://models.test:{port}/v1
    credential: MODEL_KEY
    models: [test-claude]
  curl-only:
    kind: openai
    base_url: https://models.test:{port}/v1
    credential: MODEL_KEY
    models: [curl-model]
    binaries: [{{path: /usr/bin/curl}}]
"""

AGENT = """\
import json, sys
sys.path.insert(0, {site!r})
import anthropic, openai
out = {{}}
msgs = [{{"role": "user", "content": "prompt-xyzzy"}}]
o = openai.OpenAI(base_url="https://inference.local/v1", api_key={dummy!r}, max_retries=0, timeout=60)
out["chat"] = o.chat.completions.create(model="test-chat", messages=msgs).choices[0].message.content
stream = o.chat.completions.create(model="test-chat", messages=msgs, stream=True)
out["stream"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
out["embedding"] = o.embeddings.create(model="test-embed", input="x").data[0].embedding
out["models"] = sorted(m.id for m in o.models.list())
out["echo"] = o.chat.completions.create(model="echo-key", messages=msgs).choices[0].message.content
for model in ("not-routed", "curl-model"):
    try:
        o.chat.completions.create(model=model, messages=msgs)
        out[model] = "answered"
    except openai.APIStatusError as exc:
        out[model] = exc.status_code
got = []
try:
    for c in o.chat.completions.create(model="stall", messages=msgs, stream=True):
        got.append(c.choices[0].delta.content or "")
    out["stall"] = "finished"
except openai.APIError as exc:
    out["stall"] = "error: " + str(exc)
out["stall_got"] = "".join(got)
a = anthropic.Anthropic(base_url="https://inference.local", api_key={dummy!r}, max_retries=0, timeout=60)
out["claude"] = a.messages.create(model="test-claude", max_tokens=8, messages=msgs).content[0].text
with a.messages.stream(model="test-claude", max_tokens=8, messages=msgs) as s:
    out["claude_stream"] = "".join(s.text_stream)
out["claude_models"] = sorted(m.id for m in a.models.list())
print("RESULT " + json.dumps(out))
"""

CURL = """\
body='{{"model": "curl-model", "messages": [{{"role": "user", "content": "hi"}}]}}'
echo "proxy $(curl -sS -o /dev/null -w '%{{http_code}}' https://inference.local/v1/chat/completions \
  -H 'Authorization: Bearer {dummy}' -H 'Content-Type: application/json' -d "$body")"
echo "transparent $(curl -sS --noproxy '*' -o /dev/null -w '%{{http_code}}' \
  https://inference.local/v1/chat/completions -H 'x-api-key: {dummy}' -d "$body")"
echo "files $(curl -sS -o /dev/null -w '%{{http_code}}' https://inference.local/v1/files)"
echo "encoded $(curl -sS -o /dev/null -w '%{{http_code}}' --path-as-is \
  https://inference.local/v1/chat%2Fcompletions -d "$body")"
"""


@dataclass
class Models:
    log: Path
    dns: DnsServer
    routes: Path
    credentials: Path
    ca_file: Path
    runtime: str
    scripts: Path

    def requests(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def dev(self, command: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
        result = subprocess.run(
            [*CLI, "dev", "--log-format=json", f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}",
             f"--credentials={self.credentials}", f"--inference-routes={self.routes}",
             f"--upstream-ca={self.ca_file}", f"--inference-idle-timeout={IDLE}", "--", "sh", "-c", command],
            capture_output=True, text=True, timeout=180, env={**os.environ, "XDG_RUNTIME_DIR": self.runtime},
        )  # fmt: skip
        events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        return result, events


@pytest.fixture(scope="module")
def models() -> Iterator[Models]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    root = Path(tempfile.mkdtemp(prefix="osb-inf-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        ca = trustme.CA()
        leaf = ca.issue_cert("models.test")
        cert, key, ca_file = root / "cert.pem", root / "key.pem", root / "ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(ca_file))
        log = root / "requests.jsonl"
        scripts = root / "scripts"
        scripts.mkdir()
        with open_test_host() as host:
            host.popen([sys.executable, str(BACKEND), host.address, str(PORT), str(cert), str(key), str(log), KEY],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            with DnsServer({"models.test": [host.address]}) as dns:
                routes, credentials = root / "routes.yaml", root / "credentials.yaml"
                routes.write_text(ROUTES.format(port=PORT, address=host.address))
                credentials.write_text(f"MODEL_KEY:\n  secret: {KEY}\n  hosts: []\n")
                subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
                _wait(host.address)
                yield Models(log, dns, routes, credentials, ca_file, runtime, scripts)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _wait(address: str) -> None:
    import socket

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the test model server did not come up")


def _not_json(text: str) -> str:
    """What the agent and dev wrote to stderr, without the daemons' JSON events."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("{"))


def _site() -> str:
    found = sorted(SDKS.glob("lib/python3*/site-packages"))
    if not found or not (found[0] / "openai").is_dir() or not (found[0] / "anthropic").is_dir():
        pytest.skip(f"the agent's SDKs are not installed in {SDKS} (scripts/install-inference-sdks.sh)")
    return str(found[0])


def test_sdks_reach_the_backend_with_its_key_and_never_hold_it(models: Models) -> None:
    script = AGENT.format(site=_site(), dummy=DUMMY)
    result, events = models.dev(f"/usr/bin/python3 -c {shlex.quote(script)}")  # the agent's /tmp is its own
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, (result.stdout[-2000:], _not_json(result.stderr)[-6000:])
    out = json.loads(lines[0][len("RESULT ") :])
    assert out["chat"] == "hello from the test model"
    assert out["stream"].split() == ["hello", "from", "the", "test", "model"]
    assert out["embedding"] == [0.25, 0.5, 0.75]
    assert out["models"] == ["echo-key", "stall", "test-chat", "test-claude", "test-embed"]  # not curl-model
    assert out["claude_models"] == out["models"]
    assert out["claude"] == "hello from the test model"
    assert out["claude_stream"].split() == ["hello", "from", "the", "test", "model"]
    # the echoed key reaches the agent as its placeholder, never as the key
    assert KEY not in result.stdout and out["echo"] == "key=Bearer openshell:resolve:env:MODEL_KEY"
    # refused before any backend: a model no route serves, a route that names only curl
    assert out["not-routed"] == 403 and out["curl-model"] == 403
    # the stalled stream is cut at the idle bound: the SDK raises, after the part that came
    assert out["stall"] == f"error: the backend sent nothing for {IDLE} s", out["stall"]
    assert out["stall_got"] == "partial answer "

    seen = models.requests()
    assert seen and all(r["key_ok"] for r in seen)
    assert not any(DUMMY in value for r in seen for value in r["headers"].values())
    assert {r["model"] for r in seen} == {"backend-chat", "test-embed", "echo-key", "stall", "test-claude"}
    assert not any(r["model"] in ("not-routed", "curl-model", "test-chat") for r in seen)

    inference = [e for e in events if e.get("event") == "inference"]
    denied = [e for e in inference if e.get("decision") == "deny"]
    assert {e.get("model") for e in denied} == {"not-routed", "curl-model"}
    ok = [e for e in inference if e.get("route") == "local-openai" and e.get("status") == 200]
    assert ok and all(e["bytes_down"] > 0 and "duration_ms" in e for e in ok)
    assert not any("hello from" in json.dumps(e) or "xyzzy" in json.dumps(e) for e in inference)  # no prompt, no answer
    cut = [e for e in inference if e.get("model") == "stall"]
    assert cut and cut[0]["reason"] == "upstream-idle"
    assert KEY not in result.stderr


def test_curl_through_the_proxy_and_transparently_and_what_is_refused(models: Models) -> None:
    before = len(models.requests())
    result, events = models.dev(CURL.format(dummy=DUMMY))
    said = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert said.get("proxy") == "200" and said.get("transparent") == "200", (result.stdout, result.stderr[-3000:])
    assert said.get("files") == "404" and said.get("encoded") == "404"
    seen = models.requests()[before:]
    assert [r["model"] for r in seen] == ["curl-model", "curl-model"]
    assert all(r["key_ok"] and DUMMY not in json.dumps(r["headers"]) for r in seen)
    dns = [e for e in events if e.get("event") == "dns" and e.get("name") == "inference.local"]
    answered = [e for e in dns if e.get("decision") == "answered-inference"]
    assert answered and answered[0]["addresses"] == ["169.254.7.80"], dns
