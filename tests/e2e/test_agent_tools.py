"""The agent's everyday tools trust the sandbox CA through the variables the boundary sets, each through the one it
reads (docs/policy.md "Tools in the agent"): dev mode (model R, root) with an HTTPS origin on a test host whose L7
rules make control terminate TLS. Every tool runs with the other CA variables removed, so it passes only through
its own; the origin must see each request, so the tool trusted the interception CA and got through.

npm runs under a global npmrc naming another CA with ``cafile=`` (as many corporate machines have), set through
``npm_config_globalconfig`` in a temporary prefix in the agent's ``/tmp``: only ``npm_config_cafile`` in the
environment wins over it. The machine's own npmrc is never read or touched.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from tests.k8s.podman_env import WHEEL, simple_index
from tests.netns_hosts import DnsServer, open_test_host, require_netns

CLI = [sys.executable, "-m", "supervisor.cli"]
RECORDER = Path(__file__).parent.parent / "https_recorder.py"
PORT = 8443
URL = f"https://tools.test:{PORT}"
CA_VARIABLES = (
    "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "npm_config_cafile",
    "NODE_EXTRA_CA_CERTS", "DENO_CERT",
)  # fmt: skip

POLICY = """\
version: 1
network_policies:
  tools:
    endpoints:
      - host: tools.test
        port: {port}
        protocol: rest
        enforcement: enforce
        allowed_ips: ["{address}/32"]
        rules:
          - allow: {{method: GET, path: "/**"}}
    binaries:
      - path: /usr/bin/curl
      - path: /usr/bin/python3*
      - path: /usr/bin/node
      - path: /usr/lib/git-core/git-remote-http
"""


@dataclass
class Origin:
    log: Path
    policy: Path
    dns: DnsServer
    ca_file: Path
    other_ca_pem: str
    runtime: str

    def paths(self) -> list[str]:
        if not self.log.exists():
            return []
        return [json.loads(line)["path"] for line in self.log.read_text().splitlines()]

    def dev(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "dev", "-q", f"--policy={self.policy}", f"--upstream-ca={self.ca_file}",
             f"--dns-server={self.dns.address[0]}:{self.dns.address[1]}", "--", "sh", "-c", script],
            capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
            env={**os.environ, "XDG_RUNTIME_DIR": self.runtime},
        )  # fmt: skip


def only(*kept: str) -> str:
    """``env -u …``: every CA variable removed but ``kept``."""
    return "env " + " ".join(f"-u {name}" for name in CA_VARIABLES if name not in kept)


def _npm_registry(root: Path) -> None:
    """A registry of one package under ``root/packages/npm``: its packument and its tarball, with integrity."""
    package = json.dumps({"name": "tinynpm", "version": "1.0.0"}).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/package.json")
        info.size, info.mode = len(package), 0o644
        tar.addfile(info, io.BytesIO(package))
    tarball = raw.getvalue()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    registry = root / "packages" / "npm"
    registry.mkdir(parents=True)
    (registry / "tinynpm-1.0.0.tgz").write_bytes(tarball)
    version = {"name": "tinynpm", "version": "1.0.0",
               "dist": {"tarball": f"{URL}/packages/npm/tinynpm-1.0.0.tgz", "integrity": integrity}}  # fmt: skip
    packument = {"name": "tinynpm", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}}
    (registry / "tinynpm").write_text(json.dumps(packument))


def _git_repo(root: Path, www: Path) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(root / "work")], check=True)
    (root / "work" / "README").write_text("cloned by git\n")
    subprocess.run([*git, "-C", str(root / "work"), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(root / "work"), "commit", "-qm", "first"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(root / "work"), str(www / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(www / "repo.git"), "update-server-info"], check=True)


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    require_netns()
    if os.geteuid() != 0:
        pytest.skip("dev mode runs the boundary in model R here (root)")
    root = Path(tempfile.mkdtemp(prefix="osb-tools-"))
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    try:
        ca, other = trustme.CA(), trustme.CA()
        leaf = ca.issue_cert("tools.test")
        cert, key, ca_file = root / "cert.pem", root / "key.pem", root / "ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(ca_file))
        www = root / "www"
        www.mkdir()
        simple_index(www)
        _npm_registry(www)
        _git_repo(root, www)
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        log = root / "requests.jsonl"
        with open_test_host() as host:
            host.popen([sys.executable, str(RECORDER), host.address, str(PORT), str(cert), str(key), str(log)],
                       env={**os.environ, "RECORDER_ROOT": str(www)},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            with DnsServer({"tools.test": [host.address]}) as dns:
                policy = root / "policy.yaml"
                policy.write_text(POLICY.format(port=PORT, address=host.address))
                from tests.e2e.egress_world import _wait_http

                _wait_http(host.address, PORT)
                yield Origin(log, policy, dns, ca_file, other.cert_pem.bytes().decode(), runtime)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _run(origin: Origin, tool: str, command: str, *, path: str) -> str:
    """Run one tool's ``command`` in the agent; assert it exited 0 and that ``path`` reached the origin."""
    before = len(origin.paths())
    result = origin.dev(command)
    assert result.returncode == 0, f"{tool}: exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    seen = origin.paths()[before:]
    assert any(p.startswith(path) for p in seen), f"{tool}: {path} never reached the origin: {seen}"
    return result.stdout


def test_curl_reads_curl_ca_bundle(origin: Origin) -> None:
    out = _run(origin, "curl", f"{only('CURL_CA_BUNDLE')} curl -sS -f {URL}/curl", path="/curl")
    assert json.loads(out)["path"] == "/curl"


def test_python_requests_reads_requests_ca_bundle(origin: Origin) -> None:
    script = f"import requests; print(requests.get('{URL}/requests', timeout=30).json()['path'])"
    out = _run(origin, "requests", f'{only("REQUESTS_CA_BUNDLE")} python3 -c "{script}"', path="/requests")
    assert out.strip() == "/requests"


def test_python_ssl_reads_ssl_cert_file(origin: Origin) -> None:
    """OpenSSL's own variable: what Go, Rust's native-tls and rustls-native-certs, Ruby and httpx read too."""
    script = f"import urllib.request as u; print(u.urlopen('{URL}/openssl', timeout=30).status)"
    out = _run(origin, "urllib", f'{only("SSL_CERT_FILE")} python3 -c "{script}"', path="/openssl")
    assert out.strip() == "200"


def test_pip_reads_pip_cert(origin: Origin) -> None:
    if subprocess.run(["/usr/bin/python3", "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("/usr/bin/python3 -m pip is needed (python3-pip)")
    command = (
        f"cd /tmp && {only('PIP_CERT')} PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 python3 -m pip download "
        f"-q --no-deps --only-binary=:all: --index-url {URL}/simple/ -d /tmp/dl tinypkg==1.0 && ls /tmp/dl"
    )
    out = _run(origin, "pip", command, path=f"/packages/{WHEEL}")
    assert out.split() == [WHEEL]


def test_git_reads_git_ssl_cainfo(origin: Origin) -> None:
    command = f"cd /tmp && {only('GIT_SSL_CAINFO')} git clone -q {URL}/repo.git r && cat r/README"
    out = _run(origin, "git", command, path="/repo.git")
    assert out == "cloned by git\n"


def test_node_reads_node_extra_ca_certs(origin: Origin) -> None:
    if shutil.which("node") is None:
        pytest.skip("node is needed (apt-get install nodejs)")
    script = f"require('https').get('{URL}/node', r => {{ console.log(r.statusCode); r.resume() }})"
    out = _run(origin, "node", f'{only("NODE_EXTRA_CA_CERTS")} node -e "{script}"', path="/node")
    assert out.strip() == "200"


def test_npm_reads_npm_config_cafile_over_a_global_cafile(origin: Origin) -> None:
    if shutil.which("npm") is None:
        pytest.skip("npm is needed (apt-get install npm; scripts/install-test-deps.sh)")
    prefix = "/tmp/npm-prefix"
    command = "\n".join([
        f"mkdir -p {prefix}/etc && cd /tmp",
        f"cat > {prefix}/other-ca.pem <<'EOF'\n{origin.other_ca_pem.strip()}\nEOF",
        f"echo 'cafile={prefix}/other-ca.pem' > {prefix}/etc/npmrc",
        f"export npm_config_globalconfig={prefix}/etc/npmrc npm_config_prefix={prefix} "
        f"npm_config_cache={prefix}/cache npm_config_update_notifier=false npm_config_fund=false "
        "npm_config_audit=false npm_config_fetch_retries=0",
        f"{only('npm_config_cafile')} npm pack --silent --registry={URL}/packages/npm/ tinynpm",
    ])  # fmt: skip
    out = _run(origin, "npm", command, path="/packages/npm/tinynpm-1.0.0.tgz")
    assert out.strip().splitlines()[-1] == "tinynpm-1.0.0.tgz"
