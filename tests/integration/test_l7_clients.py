"""Real clients through ``inspect``: curl, python requests and git, each configured by environment alone
(``HTTPS_PROXY`` plus the CA variables the boundary sets: ``CURL_CA_BUNDLE``, ``REQUESTS_CA_BUNDLE``,
``SSL_CERT_FILE``, ``GIT_SSL_CAINFO``) and trusting nothing but the sandbox CA.

A minimal CONNECT front on 127.0.0.1 stands in for the boundary's proxy listener (read ``CONNECT h:p``,
answer 200, hand the rest to ``inspect``); the origin is an HTTPS server with a trustme certificate that also
serves a git repository through ``git http-backend`` behind Basic authentication, so a clone succeeds only
if control turned the placeholder inside the agent's Basic credentials into the secret. Names are never
resolved: the clients hand them to the proxy, and the test dials 127.0.0.1.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import shutil
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import h11
import pytest
import trio
import trustme

from supervisor.control.credentials import Credentials
from supervisor.control.l7 import InterceptionCA, Limits, inspect, upstream_context
from supervisor.control.l7.streams import PrefixedStream
from supervisor.control.policy import BinaryIdentity, L4Request, PolicyStore, compile_policy, load_policy_text
from supervisor.jsonlog import JsonLog

pytestmark = pytest.mark.skipif(shutil.which("curl") is None or shutil.which("git") is None,
                                reason="curl and git are needed")  # fmt: skip

SECRET = "ghs_REAL-installation-token-42"
PLACEHOLDER = "openshell:resolve:env:GITHUB_TOKEN"
POLICY = """
version: 1
network_policies:
  forge:
    endpoints:
      - host: forge.test
        port: 443
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {method: GET, path: "/**"}
          - allow: {method: POST, path: "/repo.git/git-upload-pack"}
      - host: elsewhere.test
        port: 443
        protocol: rest
        enforcement: enforce
        access: full
    binaries: [{path: /usr/bin/curl}]
"""


@dataclass
class GitOrigin:
    """HTTPS origin: ``/repo.git/*`` through ``git http-backend`` behind Basic auth; anything else echoes."""

    ctx: ssl.SSLContext
    root: Path
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, target, authorization
    port: int = 0

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, self.handle, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    async def handle(self, tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, self.ctx, server_side=True, https_compatible=True)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request: h11.Request | None = None
                body = bytearray()
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await stream.receive_some(65536))
                    elif isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return
                assert request is not None
                headers = {k.decode().lower(): v.decode() for k, v in request.headers}
                target = request.target.decode()
                self.seen.append((request.method.decode(), target, headers.get("authorization")))
                status, out_headers, payload = await self._respond(request.method.decode(), target, headers,
                                                                   bytes(body))  # fmt: skip
                out_headers.append(("content-length", str(len(payload))))
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=out_headers)) or b"")
                await stream.send_all(conn.send(h11.Data(data=payload)) or b"")
                await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def _respond(self, method: str, target: str, headers: dict[str, str], body: bytes
                       ) -> tuple[int, list[tuple[str, str]], bytes]:  # fmt: skip
        if not target.startswith("/repo.git/"):
            echo = {"method": method, "target": target, "authorization": headers.get("authorization")}
            return 200, [("content-type", "application/json")], json.dumps(echo).encode()
        expected = "Basic " + base64.b64encode(f"x-access-token:{SECRET}".encode()).decode()
        if headers.get("authorization") != expected:
            return 401, [("www-authenticate", 'Basic realm="forge"')], b"auth required\n"
        path, _, query = target.partition("?")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": "x-access-token",
            "REMOTE_ADDR": "127.0.0.1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": str(self.root),
        }
        done = await trio.run_process(["git", "http-backend"], stdin=body, capture_stdout=True, env=env)
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        status = 200
        out: list[tuple[str, str]] = []
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                out.append((name.strip(), value.strip()))
        return status, out, payload


@dataclass
class Front:
    """Stand-in for the boundary's proxy listener: ``CONNECT h:p`` → 200 → ``inspect``."""

    origin: GitOrigin
    ca: InterceptionCA
    upstream_ssl: ssl.SSLContext
    store: PolicyStore = field(default_factory=lambda: PolicyStore(
        compile_policy(load_policy_text(POLICY, "clients.yaml")), source="clients.yaml"))  # fmt: skip
    credentials: Credentials = field(default_factory=lambda: Credentials.from_mapping(
        {"GITHUB_TOKEN": {"secret": SECRET, "hosts": ["forge.test:443"]}}))  # fmt: skip
    log: io.StringIO = field(default_factory=io.StringIO)
    port: int = 0

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, self.handle, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    async def handle(self, stream: trio.SocketStream) -> None:
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            data = await stream.receive_some(4096)
            if not data:
                return
            buffer += data
        head, _, rest = buffer.partition(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n")[0].decode().split(" ")
        assert method == "CONNECT", head
        host, port = target.rsplit(":", 1)
        snapshot = self.store.snapshot()
        l4 = snapshot.decide_l4(L4Request(host, int(port), BinaryIdentity("/usr/bin/curl", None)))
        if not l4.allowed:
            await stream.send_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await stream.aclose()
            return
        await stream.send_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")

        async def dial() -> trio.abc.HalfCloseableStream:
            return await trio.open_tcp_stream("127.0.0.1", self.origin.port)

        await inspect(PrefixedStream(stream, rest), host=host, port=int(port), tls=None, snapshot=snapshot, l4=l4,
                      connect_upstream=dial, ca=self.ca, credentials=self.credentials,
                      upstream_ssl=self.upstream_ssl, log=JsonLog("control", stream=self.log),
                      limits=Limits(idle_timeout=20))  # fmt: skip


@dataclass
class World:
    front: Front
    origin: GitOrigin
    env: dict[str, str]
    home: Path

    async def run(self, argv: list[str], **env: str) -> subprocess.CompletedProcess[bytes]:
        with trio.fail_after(60):
            return await trio.run_process(argv, env={**self.env, **env}, capture_stdout=True, capture_stderr=True,
                                          check=False)  # fmt: skip


def _make_repo(root: Path) -> None:
    work = root / "work"
    work.mkdir()
    env = {**os.environ, "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1"}
    for argv in (["git", "init", "-q", "-b", "main", str(work)],
                 ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                  "--allow-empty", "-m", "hello through the sandbox"],
                 ["git", "clone", "-q", "--bare", str(work), str(root / "repo.git")]):  # fmt: skip
        subprocess.run(argv, check=True, env=env, capture_output=True)


@pytest.fixture
async def world(nursery: trio.Nursery, tmp_path: Path) -> World:
    authority = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("forge.test", "elsewhere.test").configure_cert(server_ctx)
    repos = tmp_path / "srv"
    repos.mkdir()
    _make_repo(repos)
    origin = GitOrigin(server_ctx, repos)
    await origin.start(nursery)
    ca = InterceptionCA.generate("clients")
    front = Front(origin, ca, upstream_context(extra_ca_pem=authority.cert_pem.bytes().decode(), system_trust=False))
    await front.start(nursery)
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_text(ca.cert_pem)  # what the boundary writes (here without the system CAs: trust nothing else)
    home = tmp_path / "home"
    home.mkdir()
    proxy = f"http://127.0.0.1:{front.port}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HTTPS_PROXY": proxy,
        "https_proxy": proxy,
        "NO_PROXY": "",
        "SSL_CERT_FILE": str(bundle),
        "REQUESTS_CA_BUNDLE": str(bundle),
        "CURL_CA_BUNDLE": str(bundle),
        "GIT_SSL_CAINFO": str(bundle),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GITHUB_TOKEN": PLACEHOLDER,  # what the agent's environment holds
    }
    return World(front, origin, env, home)


async def test_curl_get_allowed_post_denied_with_placeholder_injected(world: World) -> None:
    got = await world.run(["curl", "-sS", "-H", f"Authorization: Bearer {PLACEHOLDER}", "https://forge.test/user"])
    assert got.returncode == 0, got.stderr
    assert world.origin.seen[0][2] == f"Bearer {SECRET}"  # the origin got the secret
    # it echoed it, and the agent reads its placeholder back: a secret never flows back (design "No secret flows back")
    assert json.loads(got.stdout)["authorization"] == f"Bearer {PLACEHOLDER}" and SECRET.encode() not in got.stdout
    denied = await world.run(["curl", "-sS", "-w", "\n%{http_code}", "-d", "x=1", "https://forge.test/user"])
    body, status = denied.stdout.rsplit(b"\n", 1)
    assert status == b"403" and json.loads(body)["error"] == "policy_denied"
    assert [s[0] for s in world.origin.seen] == ["GET"]
    assert SECRET not in world.front.log.getvalue()


async def test_curl_placeholder_toward_an_unbound_host_never_leaves(world: World) -> None:
    got = await world.run(["curl", "-sS", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {PLACEHOLDER}",
                           "https://elsewhere.test/user"])  # fmt: skip
    body, status = got.stdout.rsplit(b"\n", 1)
    assert status == b"403" and json.loads(body)["error"] == "credential_endpoint_mismatch"
    assert world.origin.seen == []


async def test_curl_domain_fronting_is_refused(world: World) -> None:
    got = await world.run(["curl", "-sS", "-w", "\n%{http_code}", "-H", "Host: forge.test",
                           "-H", f"Authorization: Bearer {PLACEHOLDER}", "https://elsewhere.test/user"])  # fmt: skip
    body, status = got.stdout.rsplit(b"\n", 1)
    assert status == b"403" and json.loads(body)["error"] == "request_authority_mismatch"
    assert world.origin.seen == []


async def test_python_requests_trusts_the_ca_from_the_environment(world: World) -> None:
    script = ("import os, requests\n"
              "auth = {'Authorization': 'token ' + os.environ['GITHUB_TOKEN']}\n"
              "r = requests.get('https://forge.test/v1/me', headers=auth)\n"
              "print(r.status_code, r.json()['authorization'])\n")  # fmt: skip
    got = await world.run([sys.executable, "-c", script])
    assert got.returncode == 0, got.stderr
    assert got.stdout.decode().split() == ["200", "token", PLACEHOLDER]  # the echo carries the placeholder back
    assert world.origin.seen[-1][2] == f"token {SECRET}"  # while the origin got the secret


async def test_git_clone_with_a_placeholder_in_basic_auth(world: World, tmp_path: Path) -> None:
    url = f"https://x-access-token:{PLACEHOLDER}@forge.test/repo.git"
    got = await world.run(["git", "clone", "-q", url, str(tmp_path / "clone")])
    assert got.returncode == 0, got.stderr
    log = await world.run(["git", "-C", str(tmp_path / "clone"), "log", "--format=%s"])
    assert log.stdout.strip() == b"hello through the sandbox"
    assert [s[:2] for s in world.origin.seen][:2] == [("GET", "/repo.git/info/refs?service=git-upload-pack")] * 2
    authorized = [s for s in world.origin.seen if s[2] is not None]
    assert authorized and all(SECRET in base64.b64decode(s[2].split()[1]).decode() for s in authorized if s[2])
    assert SECRET not in world.front.log.getvalue()
    pushes = await world.run(["git", "-C", str(tmp_path / "clone"), "push", "-q", url, "HEAD:refs/heads/x"])
    assert pushes.returncode != 0  # receive-pack is not in the allow rules
    assert not any("receive-pack" in s[1] and s[0] == "POST" for s in world.origin.seen)
