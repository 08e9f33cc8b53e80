"""The rendered proxy-pod set, run as rendered but without a cluster: what kubelet would do, done by hand.

``k8s render --topology proxy-pod`` writes the objects and the Secrets; this module lays the Secrets out as
Secret volumes, runs control's own rendered init script and command line (paths moved under a temporary
directory, the listener on loopback), runs the workload's rendered CA-bundle init script over a stand-in
"image" whose system bundle holds the origins' CA, and then runs real clients (curl, python3's urllib) with
exactly the rendered environment — the token expanded from its Secret as kubelet expands ``$(VAR)``, the
Service name replaced by control's loopback address (what cluster DNS would answer). No ``--proxy`` or
``--cacert`` flag: the variables must be enough.

From the agent's side: an allowed host works through TLS termination; a ``tls: skip`` host verifies against the
image's own system bundle inside the combined file (with the CA-only file it fails: why the combined bundle
exists); a denied host is refused and never reached; the same variables without the token get ``407``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
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
import yaml

from supervisor.k8s.objects import COPY_DIR, POLICY_DIR, SECRETS_MOUNT, TRUST_DIR
from tests.netns_hosts import DnsServer, NetnsHost, open_test_host, require_netns

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "supervisor.cli"]
RECORDER = ROOT / "tests" / "https_recorder.py"
UID = "5a1d0c2e-8b7f-4e1d-9a3c-2f8b1e0d6c5a"
TLS_PORT, RAW_PORT = 8443, 9443
POLICY = """\
version: 1
network_policies:
  api:
    endpoints:
      - {{host: api.test, port: {tls}, allowed_ips: ["{address}/32"]}}
      - {{host: pinned.test, port: {raw}, tls: skip, allowed_ips: ["{address}/32"]}}
"""
Doc = dict[str, Any]


@dataclass
class Rendered:
    tmp: Path
    control: subprocess.Popen[str]
    port: int
    log: Path
    env: dict[str, str]  # the agent's environment, as rendered and expanded
    token: str
    origin_logs: tuple[Path, Path]
    service: str

    def events(self, kind: str) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e.get("event") == kind]

    def origin(self, index: int) -> list[dict[str, Any]]:
        path = self.origin_logs[index]
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _secret_files(secret: Doc) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def _lay_out_secrets(pod: Doc, container: Doc, secrets: dict[str, Doc], moved: Path) -> None:
    """Each Secret volume the container mounts, as kubelet writes it (files of the Secret, ``defaultMode``)."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "secret" not in volume:
            continue
        target = moved / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        for name, content in _secret_files(secrets[volume["secret"]["secretName"]]).items():
            (target / name).write_bytes(content)
            (target / name).chmod(volume["secret"]["defaultMode"])


def _moved(text: str, root: Path) -> str:
    for prefix in (COPY_DIR, SECRETS_MOUNT, POLICY_DIR, TRUST_DIR):
        text = text.replace(prefix, f"{root}{prefix}")
    return text


def _run_script(container: Doc, root: Path) -> None:
    assert container["command"] == ["/bin/sh", "-c"]
    script = _moved(container["args"][0], root)
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"{container['name']}: {result.stderr}"


def _expanded_env(container: Doc, secrets: dict[str, Doc]) -> tuple[dict[str, str], str]:
    env: dict[str, str] = {}
    token = ""
    for entry in container["env"]:
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            token = _secret_files(secrets[ref["name"]])[ref["key"]].decode()
            env[entry["name"]] = token
        else:
            env[entry["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], entry["value"])
    return env, token


@pytest.fixture(scope="module")
def rendered() -> Iterator[Rendered]:
    require_netns()
    if shutil.which("curl") is None or shutil.which("sh") is None:
        pytest.skip("curl and sh are needed as the agent's tools")
    tmp = Path(tempfile.mkdtemp(prefix="osb-rpp-"))
    try:
        ca = trustme.CA()
        leaf = ca.issue_cert("api.test", "pinned.test", "denied.test")
        cert, key, origin_ca = tmp / "cert.pem", tmp / "key.pem", tmp / "origin-ca.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(key))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        ca.cert_pem.write_to_path(str(origin_ca))
        logs = (tmp / "tls.jsonl", tmp / "raw.jsonl")
        with open_test_host() as host:
            for port, log in ((TLS_PORT, logs[0]), (RAW_PORT, logs[1])):
                host.popen([sys.executable, str(RECORDER), host.address, str(port), str(cert), str(key), str(log)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            names = {n: [host.address] for n in ("api.test", "pinned.test", "denied.test")}
            with DnsServer(names) as dns:
                yield from _run(tmp, host, dns, origin_ca, logs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(tmp: Path, host: NetnsHost, dns: DnsServer, origin_ca: Path, logs: tuple[Path, Path]) -> Iterator[Rendered]:
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY.format(tls=TLS_PORT, raw=RAW_PORT, address=host.address))
    result = subprocess.run(
        [*CLI, "k8s", "render", "--namespace", "agents", "--sandbox", "rendered", "--sandbox-uid", UID,
         "--image", "registry.example/agent@sha256:" + "ab" * 32, "--control-image", "registry.example/osb:1",
         "--topology", "proxy-pod", "--policy", str(policy), "--secrets-dir", str(tmp / "sec"),
         "--cluster-cidr", "none", "--networkpolicy-enforced",
         "--", "curl", "https://api.test"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all((tmp / "sec" / "secrets.yaml").read_text()) if d}
    by_kind = {d["kind"]: d for d in objects if d["kind"] in ("Deployment", "Pod", "Service", "ConfigMap")}
    service = by_kind["Service"]["metadata"]["name"]

    # control: its Secrets as volumes, its own copy script, the policy ConfigMap as a directory, its command line
    croot = tmp / "control"
    dep = by_kind["Deployment"]["spec"]["template"]["spec"]
    (init,) = dep["initContainers"]
    _lay_out_secrets(dep, init, secrets, croot)
    (croot / COPY_DIR.lstrip("/")).mkdir(parents=True)
    _run_script(init, croot)
    policy_dir = croot / POLICY_DIR.lstrip("/")
    policy_dir.mkdir(parents=True)
    for name, text in by_kind["ConfigMap"]["data"].items():
        (policy_dir / name).write_text(text)
    port = _free_port()
    args = [_moved(a, croot) for a in dep["containers"][0]["args"]]
    args = [f"--proxy-listen=127.0.0.1:{port}" if a.startswith("--proxy-listen=") else a for a in args]
    log = tmp / "control.jsonl"
    argv = [*CLI, *args, f"--dns-server={dns.address[0]}:{dns.address[1]}", f"--upstream-ca={origin_ca}",
            f"--api={tmp / 'api.sock'}", "--log-stream=none", f"--log-file={log}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        # the workload: its CA-bundle init script over an "image" whose system bundle holds the origins' CA
        wroot = tmp / "workload"
        pod = by_kind["Pod"]["spec"]
        (ca_init,) = pod["initContainers"]
        _lay_out_secrets(pod, ca_init, secrets, wroot)
        (wroot / TRUST_DIR.lstrip("/")).mkdir(parents=True)
        system = wroot / "etc/ssl/certs/ca-certificates.crt"
        system.parent.mkdir(parents=True)
        shutil.copyfile(origin_ca, system)
        script = ca_init["args"][0].replace("/etc/", f"{wroot}/etc/")
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        env, token = _expanded_env(pod["containers"][0], secrets)
        env = {k: _moved(v, wroot).replace(f"@{service}:3128", f"@127.0.0.1:{port}") for k, v in env.items()}
        ctl = Rendered(tmp, proc, port, log, env, token, logs, service)

        def listening() -> bool:
            assert proc.poll() is None, (proc.communicate()[1] or "")[-2000:]
            return bool(ctl.events("proxy.listening"))

        _wait(listening, "control's proxy listener")
        yield ctl
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def agent(ctl: Rendered, argv: list[str], **changes: str) -> subprocess.CompletedProcess[str]:
    """A tool run with the rendered environment only (plus PATH), as the workload container runs it."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **ctl.env, **changes}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def curl(ctl: Rendered, url: str, **changes: str) -> subprocess.CompletedProcess[str]:
    return agent(ctl, ["curl", "-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}", url], **changes)


def test_the_rendered_variables_alone_take_curl_through_termination(rendered: Rendered) -> None:
    assert rendered.token and rendered.token not in json.dumps(rendered.env["NO_PROXY"])
    assert rendered.env["HTTPS_PROXY"] == f"http://sandbox:{rendered.token}@127.0.0.1:{rendered.port}"
    before = len(rendered.origin(0))
    result = curl(rendered, f"https://api.test:{TLS_PORT}/rendered")
    assert result.returncode == 0 and result.stdout.rstrip().endswith("200"), result.stderr
    assert len(rendered.origin(0)) == before + 1 and rendered.origin(0)[-1]["path"] == "/rendered"
    assert rendered.token not in json.dumps(rendered.origin(0)[-1]), "the proxy token never reaches the origin"


def test_python_urllib_uses_the_same_variables(rendered: Rendered) -> None:
    code = f"import urllib.request as u; print(u.urlopen('https://api.test:{TLS_PORT}/py', timeout=20).status)"
    result = agent(rendered, ["/usr/bin/python3", "-I", "-c", code])
    assert result.returncode == 0 and result.stdout.strip() == "200", result.stderr
    assert rendered.origin(0)[-1]["path"] == "/py"


def test_a_tls_skip_host_verifies_against_the_images_own_bundle_in_the_combined_file(rendered: Rendered) -> None:
    before = len(rendered.origin(1))
    result = curl(rendered, f"https://pinned.test:{RAW_PORT}/raw")
    assert result.returncode == 0 and result.stdout.rstrip().endswith("200"), result.stderr
    assert len(rendered.origin(1)) == before + 1
    # The CA alone (what NODE_EXTRA_CA_CERTS gets) in place of the combined file: the raw host cannot verify.
    alone = rendered.env["NODE_EXTRA_CA_CERTS"]
    result = curl(rendered, f"https://pinned.test:{RAW_PORT}/raw-ca-only", CURL_CA_BUNDLE=alone, SSL_CERT_FILE=alone)
    assert result.returncode != 0 and len(rendered.origin(1)) == before + 1


def test_a_denied_host_is_refused_and_never_reached(rendered: Rendered) -> None:
    before = [len(rendered.origin(i)) for i in (0, 1)]
    result = curl(rendered, f"https://denied.test:{TLS_PORT}/x")
    assert result.returncode != 0 and "403" in result.stdout + result.stderr
    assert [len(rendered.origin(i)) for i in (0, 1)] == before


def test_the_same_variables_without_the_token_get_407_and_reach_nothing(rendered: Rendered) -> None:
    before = [len(rendered.origin(i)) for i in (0, 1)]
    refused = len(rendered.events("proxy.refused"))
    bare = rendered.env["HTTPS_PROXY"].replace(f"sandbox:{rendered.token}@", "")
    wrong = rendered.env["HTTPS_PROXY"].replace(rendered.token, "x" * len(rendered.token))
    for proxy in (bare, wrong):
        result = curl(rendered, f"https://api.test:{TLS_PORT}/x", HTTPS_PROXY=proxy, https_proxy=proxy)
        assert result.returncode != 0 and "407" in result.stdout + result.stderr
    _wait(lambda: len(rendered.events("proxy.refused")) >= refused + 2, "the refusals logged")
    reasons = [e["reason"] for e in rendered.events("proxy.refused")[refused:]]
    assert reasons == ["proxy-token-missing", "proxy-token-wrong"]
    assert [len(rendered.origin(i)) for i in (0, 1)] == before
