"""The stages a spare exec-init applies to itself and those left to its commands (child.py ``SELF``,
``IN_CHILD``), and the confinement a lease is matched on (``child.confinement``; zygote.py "Spares", launcher.py
rule 5). Pure: no process is started."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from supervisor.boundary.forkimage import LandlockSpec, SpawnSpec, child
from supervisor.boundary.forkimage.child import IN_CHILD, SELF, STAGES, Stage

BASE = SpawnSpec(argv=("/bin/true",), env={"PATH": "/bin"}, cwd="/", uid=1000, gid=1000, groups=(2000,))
LANDLOCK = LandlockSpec(read_only=("/usr",), read_write=("/tmp",))

# Each of these changes what a spare exec-init has already applied (to itself) before its command arrives.
CONFINING: dict[str, dict[str, Any]] = {
    "uid": {"uid": 1001},
    "gid": {"gid": 1001},
    "groups": {"groups": (2000, 2001)},
    "no groups": {"groups": ()},
    "landlock on": {"landlock": LANDLOCK},
    "landlock paths": {"landlock": LandlockSpec(read_only=("/usr",), read_write=("/var/tmp",))},
    "landlock mode": {"landlock": replace(LANDLOCK, mode="hard_requirement")},
    "seccomp": {"seccomp": False},
}
# And these only what the command needs: a spare prepared for BASE serves them.
NOT_CONFINING: dict[str, dict[str, Any]] = {
    "argv": {"argv": ("/bin/sh", "-c", "exit 3")},
    "env": {"env": {"PATH": "/usr/bin", "K": "v"}},
    "cwd": {"cwd": "/tmp"},
    "tty": {"tty": True, "rows": 50, "cols": 200},
    "stdio": {"stdin": "null", "stdout": "inherit", "stderr": "inherit"},
}


@pytest.mark.parametrize("field", sorted(CONFINING))
def test_the_confinement_differs_when_a_confining_field_does(field: str) -> None:
    base = BASE if field != "landlock paths" and field != "landlock mode" else replace(BASE, landlock=LANDLOCK)
    other = replace(base, **CONFINING[field])
    assert child.confinement(other, False) != child.confinement(base, False)


@pytest.mark.parametrize("field", sorted(NOT_CONFINING))
def test_the_confinement_ignores_what_only_the_command_needs(field: str) -> None:
    assert child.confinement(replace(BASE, **NOT_CONFINING[field]), False) == child.confinement(BASE, False)


def test_the_connect_notify_filter_is_part_of_the_confinement() -> None:
    assert child.confinement(BASE, True) != child.confinement(BASE, False)


def test_the_confinement_round_trips_through_the_spec_a_spare_runs_ahead_with() -> None:
    """A spare exec-init rebuilds a spec from the confinement alone (``confinement_spec``) for its own stages,
    then checks the command's against it: the rebuilt spec must carry the same confinement back."""
    for spec in (BASE, replace(BASE, landlock=LANDLOCK, seccomp=False, groups=())):
        for notify in (False, True):
            conf = child.confinement(spec, notify)
            assert child.confinement(child.confinement_spec(conf), notify) == conf


def test_self_and_in_child_split_the_stages_each_in_order() -> None:
    names = [stage for stage, _ in STAGES]
    own = [stage for stage, _ in SELF]
    rest = [stage for stage, _ in IN_CHILD]
    assert sorted(own + rest) == sorted(names) and len(own + rest) == len(names)  # a partition
    assert own == [stage for stage in names if stage in own]  # each part keeps the table's order
    assert rest == [stage for stage in names if stage in rest]
    assert dict(SELF) == {stage: action for stage, action in STAGES if stage in own}  # the same actions
    assert dict(IN_CHILD) == {stage: action for stage, action in STAGES if stage not in own}
    assert rest[-1] == Stage.EXECVE  # the workload's first instruction comes after every stage (rule 1)


# A spare exec-init keeps the init's uid while it waits (so the agent cannot signal or trace it): no set-id stage
# may be its own, nor what a credential change resets (dumpable, the parent-death signal), nor what its commands
# need apart from it (an empty signal mask: it blocks what it forwards; a session of their own; their terminal,
# stdio, fds, directory, the execve).
NEVER_SELF = (
    Stage.SETGROUPS, Stage.SETRESGID, Stage.SETRESUID, Stage.CAPS, Stage.SETUID0,
    Stage.DUMPABLE, Stage.PDEATHSIG, Stage.SIGNALS, Stage.SETSID,
    Stage.CTTY, Stage.STDIO, Stage.CLOSE_FDS, Stage.CHDIR, Stage.EXECVE,
)  # fmt: skip


@pytest.mark.parametrize("stage", NEVER_SELF)
def test_no_stage_that_needs_the_command_or_changes_credentials_is_the_exec_inits(stage: Stage) -> None:
    assert stage not in dict(SELF)
    assert stage in dict(IN_CHILD)


def test_the_filters_are_the_exec_inits_and_installed_last() -> None:
    """no_new_privs, Landlock and both seccomp filters are in force on the exec-init before any command exists;
    seccomp is the last of its stages (its deny list refuses what a later one would need, e.g. seccomp(2))."""
    own = [stage for stage, _ in SELF]
    assert {Stage.NO_NEW_PRIVS, Stage.LANDLOCK, Stage.SECCOMP, Stage.CAPBSET} <= set(own)
    assert own[-1] == Stage.SECCOMP
