"""Model U forced as root: the user namespace maps the agent to its own uid, never to host root.

Before, the namespace mapped the caller's uid (0) and the agent — capabilities dropped or not — owned root's
files: it read root's 0600 secrets and wrote root-owned files. Here the workload runs as ``AGENT`` (mapped to
itself); from its side it writes a file in a host directory and tries to read a root-only 0600 file, and the
test checks on the host who owns what it wrote. A baseline read by the test itself (root) proves the file is
readable to root, so "refused" means the mapping, not a missing file.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec
from supervisor.boundary.process import Launcher, LauncherError, detect_privilege_model
from tests.integration.test_launcher_spawn import PY, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="model U as root needs root")

AGENT = 61177
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
SECRET = "root-only-secret-7f3a"

PROBE = r"""
import errno, json, os, sys
place, secret = sys.argv[1], sys.argv[2]
def attempt(fn):
    try:
        return ["ok", fn()]
    except OSError as exc:
        return ["err", errno.errorcode.get(exc.errno)]
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
def write():
    with open(os.path.join(place, "agent-file"), "w") as f:
        f.write("x")
print(json.dumps({
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid()],
    "groups": os.getgroups(),
    "uid_map": open("/proc/self/uid_map").read().split(),
    "caps": [int(status[k].split()[0], 16) for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "write": attempt(write),
    "read_secret": attempt(lambda: open(secret).read()),
    "setuid0": attempt(lambda: os.setuid(0)),
    "chown_to_root": attempt(lambda: os.chown(os.path.join(place, "agent-file"), 0, 0)),
}))
"""


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    try:
        detect_privilege_model("U")
    except LauncherError as exc:
        pytest.skip(str(exc))
    zyg = Launcher.fork()
    yield zyg
    zyg.close()


@pytest.fixture
def place() -> Iterator[Path]:
    base = Path("/var/tmp") / f"userns-root-{os.getpid()}"
    base.mkdir(mode=0o755)
    os.chown(base, AGENT, AGENT)
    secret = base / "secret"
    secret.write_text(SECRET)
    os.chown(secret, 0, 0)
    os.chmod(secret, 0o600)
    yield base
    shutil.rmtree(base, ignore_errors=True)


async def test_agent_maps_to_its_own_uid_and_owns_nothing_of_roots(launcher: Launcher, place: Path) -> None:
    assert (place / "secret").read_text() == SECRET  # baseline: root reads it
    await launcher.prepare(NamespacePlan("U", agent_ids=(AGENT, AGENT)))
    spec = SpawnSpec(argv=(PY, "-c", PROBE, str(place), str(place / "secret")), env=ENV, cwd="/", uid=AGENT, gid=AGENT)
    status, out, err = await run(launcher, spec)
    assert os.waitstatus_to_exitcode(status) == 0, err.decode()
    report = json.loads(out)
    assert report["ids"] == [AGENT] * 4
    assert report["groups"] in ([], [AGENT]), "host root's supplementary groups must not survive"
    words = report["uid_map"]
    triples = [tuple(int(w) for w in words[i : i + 3]) for i in range(0, len(words), 3)]
    assert (AGENT, AGENT, 1) in triples, triples  # the agent's uid is its own on the host
    assert report["caps"] == [0, 0, 0, 0]
    assert report["write"][0] == "ok"
    assert (place / "agent-file").stat().st_uid == AGENT and (place / "agent-file").stat().st_gid == AGENT
    assert report["read_secret"] == ["err", "EACCES"]
    assert report["setuid0"][0] == "err" and report["chown_to_root"][0] == "err"
    assert (place / "secret").stat().st_uid == 0 and (place / "agent-file").stat().st_uid == AGENT


@pytest.mark.parametrize("ids", [None, (0, 0), (AGENT, 0)])
async def test_u_as_root_refuses_a_missing_or_root_agent(launcher: Launcher, ids: tuple[int, int] | None) -> None:
    with pytest.raises((LauncherError, OSError)):
        with trio.fail_after(30):
            await launcher.prepare(NamespacePlan("U", agent_ids=ids))
