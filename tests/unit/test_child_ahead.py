"""A spare's two parts of the child's stages (child.py ``AHEAD``, ``ON_COMMAND``) and the confinement a lease is
matched on (``child.confinement``; zygote.py "Spares", launcher.py rule 5). Pure: no process is started."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from supervisor.boundary.process import LandlockSpec, SpawnSpec, child
from supervisor.boundary.process.child import AHEAD, ON_COMMAND, STAGES, Stage

BASE = SpawnSpec(argv=("/bin/true",), env={"PATH": "/bin"}, cwd="/", uid=1000, gid=1000, groups=(2000,))
LANDLOCK = LandlockSpec(read_only=("/usr",), read_write=("/tmp",))

# Each of these changes what a spare's child has already applied before its command arrives.
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
    """The spare's child rebuilds a spec from the confinement alone (``confinement_spec``) for its stages ahead,
    then checks the command's against it: the rebuilt spec must carry the same confinement back."""
    for spec in (BASE, replace(BASE, landlock=LANDLOCK, seccomp=False, groups=())):
        for notify in (False, True):
            conf = child.confinement(spec, notify)
            assert child.confinement(child.confinement_spec(conf), notify) == conf


def test_ahead_and_on_command_split_the_stages_each_in_order() -> None:
    names = [stage for stage, _ in STAGES]
    ahead = [stage for stage, _ in AHEAD]
    rest = [stage for stage, _ in ON_COMMAND]
    assert sorted(ahead + rest) == sorted(names) and len(ahead + rest) == len(names)  # a partition
    assert ahead == [stage for stage in names if stage in ahead]  # each part keeps the table's order
    assert rest == [stage for stage in names if stage in rest]
    assert dict(AHEAD) == {stage: action for stage, action in STAGES if stage in ahead}  # the same actions
    assert dict(ON_COMMAND) == {stage: action for stage, action in STAGES if stage in rest}
    assert rest[-1] == Stage.EXECVE  # the workload's first instruction comes after every stage (rule 1)


# Ahead of its command a spare's child keeps the init's uid (so the agent cannot signal or trace it): no set-id
# stage may run ahead, nor what a credential change resets (dumpable, the parent-death signal), nor anything
# that needs the command (its terminal, stdio, fds, directory, the execve).
NEVER_AHEAD = (
    Stage.SETGROUPS, Stage.SETRESGID, Stage.SETRESUID, Stage.CAPS, Stage.SETUID0,
    Stage.DUMPABLE, Stage.PDEATHSIG,
    Stage.CTTY, Stage.STDIO, Stage.CLOSE_FDS, Stage.CHDIR, Stage.EXECVE,
)  # fmt: skip


@pytest.mark.parametrize("stage", NEVER_AHEAD)
def test_no_stage_that_needs_the_command_or_changes_credentials_runs_ahead(stage: Stage) -> None:
    assert stage not in dict(AHEAD)
    assert stage in dict(ON_COMMAND)


def test_the_filters_are_ahead_and_installed_last_there() -> None:
    """no_new_privs, Landlock and both seccomp filters are in force while the child waits; seccomp is the last
    stage ahead (its deny list refuses what any later stage ahead would need, e.g. seccomp(2) itself)."""
    ahead = [stage for stage, _ in AHEAD]
    assert {Stage.NO_NEW_PRIVS, Stage.LANDLOCK, Stage.SECCOMP, Stage.CAPBSET} <= set(ahead)
    assert ahead[-1] == Stage.SECCOMP
