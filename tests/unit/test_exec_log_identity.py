"""What the identity resolver makes of the exec log's answers, on a fake /proc (no sockets, no processes).

A child (pid 20) of the agent (pid 10), made while the agent was python; the agent has since exec'd sh. Where
the exec log cannot answer for the child (its entry refused at the cap), the connection has no identity: it never
falls back to the parent's current image or to "it never exec'd", the loose answers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.boundary.capture.connect_record import ExecLog
from supervisor.boundary.capture.identity import IdentityResolver, IdentityStage, IdentityUnresolved

AGENT, CHILD = 10, 20
STARTS = {AGENT: 1000, CHILD: 2000}
PYTHON, SH = "/usr/bin/python3", "/usr/bin/sh"


def fake_proc(root: Path) -> Path:
    """/proc entries for the agent (now sh) and its child (python)."""
    for pid, ppid, exe in ((AGENT, 1, SH), (CHILD, AGENT, PYTHON)):
        d = root / str(pid)
        d.mkdir(parents=True)
        fields = ["S", str(ppid)] + ["0"] * 15 + ["1", "0", str(STARTS[pid]), "0", "0"]  # threads, start time
        (d / "stat").write_text(f"{pid} (x) {' '.join(fields)}\n")
        (d / "status").write_text(f"Name:\tx\nTgid:\t{pid}\nUid:\t1000\t1000\t1000\t1000\n")
        (d / "environ").write_bytes(b"PATH=/usr/bin\0")
        (d / "cmdline").write_bytes(b"x\0")
        os.symlink(exe, d / "exe")
    return root


def resolver(root: Path, log: ExecLog) -> IdentityResolver:
    return IdentityResolver(anchor_pid=AGENT, workload_pids=lambda: {AGENT, CHILD}, agent_pid=lambda: AGENT,
                            proc=str(fake_proc(root)), exec_log=log)  # fmt: skip


def full_log() -> ExecLog:
    """A log at its cap (one entry, a live process's) that had to refuse the child's entries."""
    log = ExecLog(limit=1, alive=lambda pid, start: True)
    log.note_child(99, 500, PYTHON)
    log.note_loader(99, 500, ())
    log.note_child(CHILD, STARTS[CHILD], PYTHON)
    log.note_loader(CHILD, STARTS[CHILD], ("LD_PRELOAD",))
    return log


def test_the_child_counts_its_parent_as_it_was_when_it_was_made(tmp_path: Path) -> None:
    log = ExecLog(alive=lambda pid, start: True)
    log.note_child(CHILD, STARTS[CHILD], PYTHON)
    assert resolver(tmp_path, log).connector(CHILD, PYTHON, None, 0).ancestors == (PYTHON,)
    # no entry and no refusal: the parent has not exec'd since the child was made, its image now is the one
    assert resolver(tmp_path / "b", ExecLog()).connector(CHILD, PYTHON, None, 0).ancestors == (SH,)


def test_an_entry_the_full_log_refused_is_no_identity(tmp_path: Path) -> None:
    with pytest.raises(IdentityUnresolved) as caught:
        resolver(tmp_path, full_log()).connector(CHILD, PYTHON, None, 0)
    assert caught.value.stage is IdentityStage.ANCESTORS


def test_loader_variables_the_full_log_refused_are_no_identity(tmp_path: Path) -> None:
    log = full_log()
    log._parent_exe.gap = -1  # the image at creation answered: only the loader walk is left to fail
    log._parent_exe.entries[(CHILD, STARTS[CHILD])] = PYTHON
    with pytest.raises(IdentityUnresolved) as caught:
        resolver(tmp_path, log).connector(CHILD, PYTHON, None, 0)
    assert caught.value.stage is IdentityStage.ANCESTORS
