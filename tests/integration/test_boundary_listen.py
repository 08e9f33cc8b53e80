"""The boundary's default listen address serves both IPv4 and IPv6 (dual-stack and IPv6-only clusters)."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.cli import daemon_parser
from supervisor.protocol.certs import make_ca
from supervisor.protocol.claims import Role
from tests.certs_fixtures import leaf_bundle


def test_the_default_listen_address_is_every_address_of_both_families() -> None:
    args = daemon_parser().parse_args(["--mode=boundary", "--bootstrap=/b", "--", "true"])
    assert args.listen == "[::]:7443"


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _free_port_both_families() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 0))
        port: int = s.getsockname()[1]
        return port


def _connects(family: socket.AddressFamily, host: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect((host, port))
        except OSError:
            return False
        return True


@pytest.mark.skipif(os.geteuid() != 0, reason="the boundary daemon runs in model R (root) here")
@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_listening_on_the_unspecified_v6_address_accepts_ipv4_and_ipv6(tmp_path: Path) -> None:
    ca = make_ca(validity=datetime.timedelta(days=1), now=datetime.datetime.now(datetime.UTC))
    leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
    port = _free_port_both_families()
    log = tmp_path / "boundary.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "--mode=boundary", f"--bootstrap={tmp_path / 'boundary'}",
             f"--listen=[::]:{port}", f"--port-file={tmp_path / 'port'}", "--privilege-model=R",
             "--agent-stdio=pipe", "--exit-linger=1", "--workdir=/tmp", "--", "sleep", "1000"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "port").exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "boundary did not start listening"
            time.sleep(0.02)
        assert _connects(socket.AF_INET, "127.0.0.1", port), "no IPv4 listener"
        assert _connects(socket.AF_INET6, "::1", port), "no IPv6 listener"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
