"""The workload's init runs a fresh interpreter, not a copy of the boundary (zygote.py "The init's image").

Every exec forks the init twice, so what the init's image holds is paid on every exec; and a copy of the
boundary's memory would carry its keys next to the agent. Checked from outside: the modules the init's entry
imports, and a prepared launcher's init as ``/proc`` shows it.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec
from supervisor.boundary.forkimage.init import _INIT_BOOT
from supervisor.boundary.process import Launcher

ROOT = Path(__file__).resolve().parents[2]
# What the boundary imports and the init must not: the event loop, the link's protocols, TLS, DNS, YAML.
BOUNDARY_ONLY = ("trio", "h2", "h11", "cryptography", "dns", "yaml", "supervisor.boundary.process.launcher")
# Modules that register an at-fork handler run it in every process the init forks (two per exec): threading's
# alone costs ~1 ms of CPU and ~180 copied pages per exec. capture.setup (subprocess, threading) is the zygote's.
FORK_HOOKED = ("threading", "random", "logging", "supervisor.boundary.capture.setup")


def test_the_inits_entry_imports_nothing_of_the_boundarys() -> None:
    entry = _INIT_BOOT.split("init_entry(")[0].rstrip("; ")  # the boot line up to the call: path + import
    script = f"{entry}; print(json.dumps(sorted(sys.modules)))"
    boot = os.memfd_create("boot")  # the init reads its import path on fd 5
    os.write(boot, json.dumps({"path": [str(ROOT), *sys.path]}).encode())
    os.lseek(boot, 0, os.SEEK_SET)
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=True, timeout=60,
            pass_fds=(boot, 5), preexec_fn=lambda: os.dup2(boot, 5),
        )  # fmt: skip
    finally:
        os.close(boot)
    loaded = set(json.loads(done.stdout))
    assert "supervisor.boundary.forkimage.init" in loaded
    assert not [name for name in loaded if name.split(".")[0] in BOUNDARY_ONLY or name in BOUNDARY_ONLY]
    assert not [name for name in loaded if name in FORK_HOOKED]


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    zyg = Launcher.fork()
    yield zyg
    zyg.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace of the launcher's own needs root (model R)")
def test_the_prepared_init_is_a_fresh_interpreter_and_still_launches(launcher: Launcher) -> None:
    async def main() -> tuple[int, int]:
        await launcher.prepare(NamespacePlan("R"))
        spawned = await launcher.spawn(SpawnSpec(("true",), {"PATH": "/usr/bin:/bin"}, "/", 1000, 1000, stdin="null"))
        nested = await launcher.spawn(
            SpawnSpec(("true",), {"PATH": "/usr/bin:/bin"}, "/", 1000, 1000, stdin="null"), own_pidns=True
        )
        return await spawned.wait_status(), await nested.wait_status()

    assert trio.run(main) == (0, 0)
    init = launcher._init_pid
    assert init is not None
    argv = Path(f"/proc/{init}/cmdline").read_bytes().split(b"\0")
    assert argv[1:4] == [b"-I", b"-S", b"-c"], argv
    status = Path(f"/proc/{init}/status").read_text()
    anon_kib = int(status.split("RssAnon:")[1].split()[0])
    ours = int(Path("/proc/self/status").read_text().split("RssAnon:")[1].split()[0])
    assert anon_kib < ours, (anon_kib, ours)  # not a copy of a process that imported trio and the rest


@pytest.mark.parametrize("package", ["supervisor.boundary.process", "supervisor.boundary.forkimage"])
def test_every_exported_name_resolves_from_its_module(package: str) -> None:
    exports = importlib.import_module(package)

    assert sorted(exports.__all__) == sorted(exports._EXPORTS)
    for name in exports.__all__:
        assert getattr(exports, name).__name__ == name
    with pytest.raises(AttributeError):
        exports.not_a_name  # noqa: B018
