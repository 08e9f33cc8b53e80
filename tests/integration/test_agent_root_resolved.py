"""getaddrinfo in the agent's own root when ``/etc/resolv.conf`` is systemd-resolved's symlink into ``/run``.

The host's real ``/etc`` is never touched: the launcher runs under ``unshare --mount`` where ``/etc`` is a copy
whose ``resolv.conf`` points at ``/run/systemd/resolve/stub-resolv.conf`` on a private ``/run``, naming
127.0.0.53 — where this test answers DNS itself. The agent (model R, sharing our network namespace so that
127.0.0.53 is this test's responder) resolves a name only that responder knows. Without the ``/run`` skeleton's
copy of the stub file glibc would fall back to 127.0.0.1 and find nothing there.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rrset
import pytest

NAME = "osb-resolved.test."
ANSWER = "192.0.2.7"
STUB = "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n"

DRIVER = r"""
import json, os, sys, trio
sys.path.insert(0, sys.argv[1])
from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec
from supervisor.boundary.process import Launcher
from supervisor.boundary.forkimage.rootfs import plan_root

workdir = sys.argv[2]
plan = plan_root(workdir=workdir, trust_dir=None, agent_uid=1000, agent_gid=1000)
PROBE = '''
import json, socket
out = {"resolv": open("/etc/resolv.conf").read(), "link": __import__("os").readlink("/etc/resolv.conf")}
try:
    out["addresses"] = sorted({a[4][0] for a in socket.getaddrinfo("%s", 80, socket.AF_INET, socket.SOCK_STREAM)})
except OSError as exc:
    out["addresses"] = str(exc)
print(json.dumps(out))
''' % sys.argv[3]


async def main():
    launcher = Launcher.fork()
    try:
        await launcher.prepare(NamespacePlan("R", netns=False, pidns=True, mountns=True, root=plan.to_wire()))
        spawned = await launcher.spawn(SpawnSpec(argv=("/usr/bin/python3", "-c", PROBE), env={"PATH": "/usr/bin"},
                                                 cwd=workdir, uid=1000, gid=1000, stdin="null"))
        data = b""
        async with trio.lowlevel.FdStream(spawned.stdout) as stream:
            while chunk := await stream.receive_some(65536):
                data += chunk
        await spawned.wait_status()
        print(json.dumps({"plan_binds": [b.target for b in plan.binds], "agent": json.loads(data or b"null")}))
    finally:
        launcher.close()

trio.run(main)
"""

SETUP = """set -e
cp -a /etc/. "$1/etc/"
ln -sfn ../run/systemd/resolve/stub-resolv.conf "$1/etc/resolv.conf"
mount --bind "$1/etc" /etc
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/systemd/resolve
printf '%s' "$2" > /run/systemd/resolve/stub-resolv.conf
shift 2
exec "$@"
"""


class Responder:
    """Answers A queries for ``NAME`` on 127.0.0.53:53 (UDP); everything else NXDOMAIN."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.53", 53))
        self.sock.settimeout(0.2)
        self.asked: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            query = dns.message.from_wire(data)
            response = dns.message.make_response(query)
            question = query.question[0]
            self.asked.append(question.name.to_text())
            if question.name.to_text().lower() == NAME and question.rdtype == 1:
                response.answer.append(dns.rrset.from_text(NAME, 0, "IN", "A", ANSWER))
            else:
                response.set_rcode(3)
            self.sock.sendto(response.to_wire(), peer)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


RESOLVED_LOCK = "/run/lock/openshell-sandbox-tests/resolved-stub-port.lock"


@pytest.fixture
def responder() -> Iterator[Responder]:
    if os.geteuid() != 0:
        pytest.skip("needs root: port 53 and a private mount namespace with /etc swapped")
    if shutil.which("unshare") is None or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("unshare (util-linux) and /usr/bin/python3 are needed")
    # The host's 127.0.0.53:53 is one port for every pytest process on the machine (two `make test` runs side by
    # side): hold a cross-process lock while answering there, so the other run waits instead of skipping.
    os.makedirs(os.path.dirname(RESOLVED_LOCK), exist_ok=True)
    with open(RESOLVED_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            server = Responder()
        except OSError as exc:
            pytest.skip(f"cannot answer DNS on 127.0.0.53:53 here: {exc}")
        yield server
        server.close()


def test_getaddrinfo_works_with_a_resolved_style_resolv_conf(responder: Responder) -> None:
    host_resolv = Path("/etc/resolv.conf").read_text()
    base = Path(tempfile.mkdtemp(prefix="osb-resolved-", dir="/tmp"))
    try:
        (base / "etc").mkdir()
        work = base / "work"
        work.mkdir(mode=0o755)
        work.chmod(0o755)
        repo = str(Path(__file__).resolve().parents[2])
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", SETUP, "setup", str(base), STUB,
             sys.executable, "-c", DRIVER, repo, str(work), NAME.rstrip(".")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.splitlines()[-1])
        assert "/run/systemd/resolve/stub-resolv.conf" in result["plan_binds"]
        agent = result["agent"]
        assert agent["link"] == "../run/systemd/resolve/stub-resolv.conf" and agent["resolv"] == STUB
        assert agent["addresses"] == [ANSWER], agent
        assert NAME in responder.asked
        assert Path("/etc/resolv.conf").read_text() == host_resolv  # the host's own file never changed
    finally:
        shutil.rmtree(base, ignore_errors=True)
