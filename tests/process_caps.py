"""The capability sets of a boundary's process tree, by role (docs/kubernetes.md "Model R: capabilities after
start"): read where the processes live (a dev sandbox on this host, or a pod's container through ``podman exec``)
by one small script, and checked against ``supervisor.boundary.forkimage.capabilities``.

Roles: the boundary (given), the launcher (its one child), the workload's init (the launcher's child), the
exec-inits (the init's children still uid 0: spares and those of running execs) and the workload's own processes
(any other uid). Every task (thread) of each process is read: capabilities are per thread.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from supervisor.boundary.forkimage import capabilities

# Run with any python3 where the processes are: prints one JSON list of the processes under /proc.
CENSUS = r"""
import json, os
out = []
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    try:
        with open(f"/proc/{name}/stat", "rb") as fh:
            stat = fh.read()
        with open(f"/proc/{name}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:300]
        tasks = []
        uid = None
        for tid in os.listdir(f"/proc/{name}/task"):
            sets = {}
            with open(f"/proc/{name}/task/{tid}/status") as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
                        sets[key] = int(value.strip(), 16)
                    elif key == "Uid":
                        uid = int(value.split()[0])
            tasks.append({"tid": int(tid), **sets})
    except OSError:
        continue
    ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
    out.append({"pid": int(name), "ppid": ppid, "uid": uid, "cmd": cmd, "tasks": tasks})
print(json.dumps(out))
"""

Census = list[dict[str, Any]]
ROLES = ("boundary", "launcher", "init", "exec-init", "workload")


def parse(text: str) -> Census:
    got = json.loads(text)
    assert isinstance(got, list)
    return got


def roles(census: Census, boundary_pid: int) -> dict[str, list[dict[str, Any]]]:
    """Each process under ``boundary_pid`` (itself included) by role; an unexpected shape fails."""
    by_pid = {proc["pid"]: proc for proc in census}
    children: dict[int, list[int]] = {}
    for proc in census:
        children.setdefault(proc["ppid"], []).append(proc["pid"])
    found: dict[str, list[dict[str, Any]]] = {role: [] for role in ROLES}
    found["boundary"].append(by_pid[boundary_pid])
    launchers = children.get(boundary_pid, [])
    assert len(launchers) == 1, f"the boundary has {len(launchers)} children: {launchers}"
    found["launcher"].append(by_pid[launchers[0]])
    inits = children.get(launchers[0], [])
    assert len(inits) == 1, f"the launcher has {len(inits)} children: {inits}"
    found["init"].append(by_pid[inits[0]])
    stack = list(children.get(inits[0], []))
    while stack:
        proc = by_pid[stack.pop()]
        below_init = proc["ppid"] == inits[0]
        found["exec-init" if proc["uid"] == 0 and below_init else "workload"].append(proc)
        stack += children.get(proc["pid"], [])
    return found


def expected(held: int) -> dict[str, int]:
    """What each role keeps of ``held`` (the container's bounding set): the effective, permitted and bounding
    sets of the boundary and launcher; the effective and permitted sets of the init and exec-inits (their
    bounding set is empty: the init clears it at start); nothing for the workload."""
    return {
        "boundary": capabilities.mask(capabilities.BOUNDARY_KEEPS) & held,
        "launcher": capabilities.mask(capabilities.LAUNCHER_KEEPS) & held,
        "init": capabilities.mask(capabilities.INIT_KEEPS) & held,
        "exec-init": capabilities.mask(capabilities.EXEC_INIT_KEEPS) & held,
        "workload": 0,
    }


def mismatches(census: Census, boundary_pid: int, held: int) -> list[str]:
    """Every task whose sets differ from its role's (an empty list: all as documented)."""
    want = expected(held)
    problems: list[str] = []
    for role, procs in roles(census, boundary_pid).items():
        for proc in procs:
            bounding = want[role] if role in ("boundary", "launcher") else 0
            for task in proc["tasks"]:
                got = {key: task[key] for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}
                should = {"CapEff": want[role], "CapPrm": want[role], "CapBnd": bounding, "CapAmb": 0}
                if got != should:
                    problems.append(
                        f"{role} pid {proc['pid']} tid {task['tid']} ({proc['cmd'][:60]}): "
                        + ", ".join(
                            f"{key} {capabilities.names(got[key])} (want {capabilities.names(should[key])})"
                            for key in got
                            if got[key] != should[key]
                        )
                    )
    return problems


def summary(census: Census, boundary_pid: int) -> str:
    """One line per process: role, pid, uid, the effective set by name (for an assertion's message)."""
    lines = []
    for role, procs in roles(census, boundary_pid).items():
        for proc in procs:
            lines.append(f"{role} {proc['pid']} uid {proc['uid']}: {capabilities.names(proc['tasks'][0]['CapEff'])}")
    return "\n".join(lines)


def check(
    read: Callable[[], Census], boundary_pid: int, held: int, *, workload: int = 1, timeout: float = 60
) -> Census:
    """Read censuses until the tree has its shape (the launcher's one child is the init: a fence re-read's short-lived
    ``nft`` is a second one; at least ``workload`` workload processes; the spare exec-inits back) and every task
    has its role's sets; fail with the last census's mismatches after ``timeout``. The settled census."""
    deadline = time.monotonic() + timeout
    while True:
        census = read()
        try:
            found = roles(census, boundary_pid)
            problems = mismatches(census, boundary_pid, held)
            shaped = len(found["workload"]) >= workload and len(found["exec-init"]) >= 1
        except AssertionError as exc:
            problems, shaped = [str(exc)], False
        if shaped and not problems:
            return census
        if time.monotonic() >= deadline:
            raise AssertionError(
                "capabilities after ready:\n" + "\n".join(problems) + "\n" + _safe_summary(census, boundary_pid)
            )
        time.sleep(0.3)


def _safe_summary(census: Census, boundary_pid: int) -> str:
    try:
        return summary(census, boundary_pid)
    except (AssertionError, KeyError):
        return json.dumps(census)[:4000]
