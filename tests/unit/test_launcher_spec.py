"""Pure parts of the launcher: spec validation and wire form, stage order, errors, Landlock rights, /proc trees."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from supervisor.boundary.forkimage import LandlockSpec, NamespacePlan, SpawnSpec, Stage, landlock, wire, zygote
from supervisor.boundary.forkimage.child import STAGES, exec_candidates, validate
from supervisor.boundary.process import SpawnError


def spec(**overrides: object) -> SpawnSpec:
    base: dict[str, object] = {"argv": ("/bin/true",), "env": {"PATH": "/bin"}, "cwd": "/", "uid": 1000, "gid": 1000}
    base.update(overrides)
    return SpawnSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({}, None),
        ({"argv": ()}, "argv is empty"),
        ({"argv": ("",)}, "argv is empty"),
        ({"argv": ("/bin/sh", "a\0b")}, "NUL byte"),
        ({"cwd": "/tmp\0x"}, "NUL byte"),
        ({"cwd": "relative"}, "cwd must be absolute"),
        ({"env": {"A=B": "x"}}, "invalid environment"),
        ({"env": {"": "x"}}, "invalid environment"),
        ({"env": {"A\0": "x"}}, "invalid environment"),
        ({"env": {"A": "x\0y"}}, "invalid environment"),
        ({"uid": -1}, "id out of range"),
        ({"gid": 2**32 - 1}, "id out of range"),  # (gid_t)-1 means "unchanged" to the kernel
        ({"groups": (5, 2**32)}, "id out of range"),
        ({"stdin": "file"}, "invalid stdio mode"),
        ({"landlock": LandlockSpec((), (), "maybe")}, "invalid landlock mode"),  # type: ignore[arg-type]
    ],
)
def test_validate(overrides: dict[str, object], problem: str | None) -> None:
    result = validate(spec(**overrides))
    if problem is None:
        assert result is None
    else:
        assert result is not None and problem in result


def test_wire_round_trip() -> None:
    original = spec(
        argv=("sh", "-c", "x"),
        env={"A": "1", "PATH": "/usr/bin"},
        groups=(10, 20),
        tty=True,
        cols=120,
        rows=40,
        stdin="null",
        stdout="inherit",
        seccomp=False,
        landlock=LandlockSpec(("/usr",), ("/tmp",), "hard_requirement"),
    )
    assert SpawnSpec.from_wire(original.to_wire()) == original
    plan = NamespacePlan("U", netns=True, pidns=False, hide_paths=("/run/x",), capture={"ports": [1]})
    assert NamespacePlan.from_wire(plan.to_wire()) == plan


def test_model_p_never_creates_namespaces() -> None:
    plan = NamespacePlan("P", hide_paths=("/x",)).effective()
    assert (plan.netns, plan.pidns, plan.mountns) == (False, False, False)
    assert NamespacePlan("R").effective() == NamespacePlan("R")


def test_stage_order_follows_the_spec() -> None:
    """§2.2: session/stdio, umask, gid, bounding set, uid, chdir after the drop, hardening, nnp, Landlock,
    seccomp, execve last."""
    order = [stage for stage, _ in STAGES]
    expected = [
        Stage.SIGNALS,
        Stage.MOUNT_NS,
        Stage.SETSID,
        Stage.CTTY,
        Stage.STDIO,
        Stage.CLOSE_FDS,
        Stage.UMASK,
        Stage.SETGROUPS,
        Stage.SETRESGID,
        Stage.CAPBSET,
        Stage.SETRESUID,
        Stage.CAPS,
        Stage.SETUID0,
        Stage.CHDIR,
        Stage.RLIMIT_CORE,
        Stage.DUMPABLE,
        Stage.PDEATHSIG,
        Stage.NO_NEW_PRIVS,
        Stage.LANDLOCK,
        Stage.SECCOMP,
        Stage.EXECVE,
    ]
    assert order == expected


@pytest.mark.parametrize(
    ("stage", "err", "code"),
    [
        ("execve", errno.ENOENT, 127),
        ("execve", errno.EACCES, 126),
        ("execve", errno.ENOEXEC, 126),
        ("chdir", errno.EACCES, 125),
        ("chdir", errno.ENOENT, 125),  # only a missing program is "not found"
        ("setresuid", errno.EPERM, 125),
        ("validate", errno.EINVAL, 125),
    ],
)
def test_spawn_error_exit_code(stage: str, err: int, code: int) -> None:
    error = SpawnError(stage, err)
    assert error.exit_code == code
    assert error.stage == stage and error.errno == err
    assert os.strerror(err) in str(error)


@pytest.mark.parametrize(
    ("name", "path", "expected"),
    [
        ("ls", "/a:/b", ["/a/ls", "/b/ls"]),
        ("ls", "/a::/b", ["/a/ls", "./ls", "/b/ls"]),  # an empty entry means the cwd, as execvp does
        ("./x", "/a", ["./x"]),
        ("/bin/true", "/a", ["/bin/true"]),
        (
            "ls",
            None,
            [f"{d}/ls" for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")],
        ),
    ],
)
def test_exec_candidates_use_the_child_path(name: str, path: str | None, expected: list[str]) -> None:
    env = {} if path is None else {"PATH": path}
    assert exec_candidates(name, env) == expected


@pytest.mark.parametrize(
    ("abi", "has", "lacks"),
    [
        (0, 0, landlock.FS_EXECUTE),
        (1, landlock.FS_MAKE_SYM, landlock.FS_REFER),
        (2, landlock.FS_REFER, landlock.FS_TRUNCATE),
        (3, landlock.FS_TRUNCATE, landlock.FS_IOCTL_DEV),
        (4, landlock.FS_TRUNCATE, landlock.FS_IOCTL_DEV),
        (5, landlock.FS_IOCTL_DEV, 1 << 16),
        (7, landlock.FS_IOCTL_DEV, 1 << 16),
    ],
)
def test_landlock_handled_rights_per_abi(abi: int, has: int, lacks: int) -> None:
    handled = landlock.handled_fs(abi)
    assert handled & has == has
    assert handled & lacks == 0


@pytest.mark.parametrize(("abi", "scoped"), [(1, 0), (5, 0), (6, 3), (7, 3)])
def test_landlock_scopes_from_abi_6(abi: int, scoped: int) -> None:
    assert landlock.scopes(abi) == scoped
    assert landlock.scopes(abi) & landlock.SCOPE_SIGNAL == (landlock.SCOPE_SIGNAL if scoped else 0)


def test_landlock_read_rights_cannot_write() -> None:
    assert landlock.READ_RIGHTS & (landlock.FS_WRITE_FILE | landlock.FS_MAKE_REG | landlock.FS_REMOVE_FILE) == 0
    assert landlock.FILE_RIGHTS & landlock.FS_READ_DIR == 0


def test_descendants_walk() -> None:
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20, 30: 12}
    assert zygote.descendants(10, parents) == {11, 12, 13, 30}
    assert zygote.descendants(20, parents) == {21}
    assert zygote.descendants(99, parents) == set()


def test_decode_rejects_truncation_and_garbage() -> None:
    assert wire.decode(b'{"id":1,"ok":true}', [], 0) == ({"id": 1, "ok": True}, [])
    for data, flags in ((b'{"id":1}', socket.MSG_TRUNC), (b'{"id":1}', socket.MSG_CTRUNC), (b"[1]", 0), (b"{nope", 0)):
        r, w = os.pipe()
        fds = [r, w]
        with pytest.raises(OSError):
            wire.decode(data, fds, flags)
        for fd in (r, w):  # closed by decode: the fds of a bad message never leak
            with pytest.raises(OSError):
                os.fstat(fd)


def test_close_all_empties_the_list() -> None:
    r, w = os.pipe()
    fds = [r, w]
    wire.close_all(fds)
    assert fds == []
    wire.close_all(fds)  # a second call closes nothing (the numbers may have been reused)
