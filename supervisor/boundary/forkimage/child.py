"""The ordered stages a workload child runs between ``fork`` and ``execve`` (docs/reference/boundary.md §2.2).

Rules of this module:

1. The order is the table ``STAGES`` and nothing else (a spare exec-init runs ``SELF`` on itself once, its
   children ``IN_CHILD``, each in table order); the workload's first instruction runs only after the last stage,
   with every control in force (invariant 2).
2. A stage that fails ends the child: it writes ``{"stage", "errno", "detail"}`` as one JSON line to the
   status pipe (close-on-exec, so EOF with no failure line means ``execve`` succeeded) and ``_exit``s.
   Non-fatal degradations (``best_effort`` Landlock) are written as ``{"note"}`` lines first.
3. ``chdir`` runs after the uid drop, so a directory the workload uid cannot enter fails with ``EACCES``
   instead of being entered by root. ``PR_SET_PDEATHSIG`` runs after it too (credential changes clear it).
4. The child never returns into its parent's code: ``run`` ends in ``execve`` or ``os._exit``.
5. The environment is exactly ``spec.env`` (the boundary builds it; nothing of ours leaks in) and ``argv[0]``
   is resolved against that environment's ``PATH``.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import json
import os
import resource
import signal
import socket
import termios
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NoReturn, TypedDict, TypeVar

from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.json_value import JsonValue

from . import landlock, linux, privilege, seccomp
from .landlock import LandlockSpec

DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STATUS_FD: Final = 3  # where the status pipe sits once stdio is in place
NOTIFY_FD: Final = 4  # the connect-notify hand-off socket, when there is one, until the seccomp stage


class Stage(enum.StrEnum):
    """Child stages, in order; the values are the ``stage`` strings of launch errors and events."""

    VALIDATE = "validate"  # boundary-side checks before anything is forked
    FORK = "fork"
    SIGNALS = "signals"
    MOUNT_NS = "mount_ns"  # R, U: the agent's own root (entered by the forking process, rootfs.py rule 5)
    SETSID = "setsid"
    CTTY = "ctty"
    STDIO = "stdio"
    CLOSE_FDS = "close_fds"
    UMASK = "umask"
    SETGROUPS = "setgroups"
    SETRESGID = "setresgid"
    CAPBSET = "capbset"
    SETRESUID = "setresuid"
    CAPS = "caps"
    SETUID0 = "verify_setuid0"
    CHDIR = "chdir"
    RLIMIT_CORE = "rlimit_core"
    DUMPABLE = "dumpable"
    PDEATHSIG = "pdeathsig"
    NO_NEW_PRIVS = "no_new_privs"
    LANDLOCK = "landlock"
    SECCOMP = "seccomp"
    EXECVE = "execve"


@dataclass(frozen=True)
class SpawnSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    tty: bool = False
    cols: int = 80
    rows: int = 24
    stdin: Literal["pipe", "null", "inherit"] = "pipe"
    stdout: Literal["pipe", "inherit"] = "pipe"
    stderr: Literal["pipe", "inherit"] = "pipe"  # with tty, one PTY for all three
    landlock: LandlockSpec | None = None
    seccomp: bool = True

    def to_wire(self) -> dict[str, JsonValue]:
        return {
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": self.cwd,
            "uid": self.uid,
            "gid": self.gid,
            "groups": list(self.groups),
            "tty": self.tty,
            "cols": self.cols,
            "rows": self.rows,
            "stdin": self.stdin,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "seccomp": self.seccomp,
            "landlock": _landlock_wire(self.landlock),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SpawnSpec:
        """Strict: each field of the type ``to_wire`` writes, else ``TypeError``/``ValueError`` (the readers turn
        those into a refused spawn; nothing later meets a wrong type)."""
        if not isinstance(data, Mapping):
            raise TypeError("a spawn spec is an object")
        ll = data.get("landlock")
        env = data["env"]
        if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
            raise TypeError("env must map strings to strings")
        if ll is not None and not isinstance(ll, Mapping):
            raise TypeError("landlock must be an object")
        return cls(
            argv=_strings(data["argv"]),
            env=dict(env),
            cwd=_string(data["cwd"]),
            uid=_integer(data["uid"]),
            gid=_integer(data["gid"]),
            groups=tuple(_integer(g) for g in _array(data.get("groups", ()))),
            tty=bool(data.get("tty", False)),
            cols=_integer(data.get("cols", 80)),
            rows=_integer(data.get("rows", 24)),
            stdin=data.get("stdin", "pipe"),
            stdout=data.get("stdout", "pipe"),
            stderr=data.get("stderr", "pipe"),
            seccomp=bool(data.get("seccomp", True)),
            landlock=None
            if ll is None
            else LandlockSpec(_strings(ll["read_only"]), _strings(ll["read_write"]), ll.get("mode", "best_effort")),
        )


def _landlock_wire(spec: LandlockSpec | None) -> dict[str, JsonValue] | None:
    if spec is None:
        return None
    return {"read_only": list(spec.read_only), "read_write": list(spec.read_write), "mode": spec.mode}


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _array(value: object) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected an array, got {type(value).__name__}")
    return value


def _strings(value: object) -> tuple[str, ...]:
    return tuple(_string(item) for item in _array(value))


def _integer(value: object) -> int:
    """An int as JSON carries it: never a bool, a float (``Infinity`` included) or a string."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def validate(spec: SpawnSpec) -> str | None:
    """Why ``spec`` cannot be launched, or ``None``. Pure; the boundary calls it before forking."""
    if not spec.argv or not spec.argv[0]:
        return "argv is empty"
    for text in (*spec.argv, spec.cwd):
        if "\0" in text:
            return "NUL byte in argv or cwd"
    for key, value in spec.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            return f"invalid environment key or value: {key!r}"
    if not os.path.isabs(spec.cwd):
        return "cwd must be absolute"
    for ident in (spec.uid, spec.gid, *spec.groups):
        if not 0 <= ident <= 0xFFFFFFFE:
            return f"id out of range: {ident}"
    if (
        spec.stdin not in ("pipe", "null", "inherit")
        or spec.stdout not in ("pipe", "inherit")
        or spec.stderr not in ("pipe", "inherit")
    ):
        return "invalid stdio mode"
    if spec.landlock is not None and spec.landlock.mode not in ("best_effort", "hard_requirement", "off"):
        return "invalid landlock mode"
    return None


def exec_candidates(name: str, env: Mapping[str, str]) -> list[str]:
    """Paths ``execve`` is tried on, in order: ``name`` itself if it has a slash, else each ``PATH`` entry."""
    if "/" in name:
        return [name]
    return [os.path.join(entry or ".", name) for entry in env.get("PATH", DEFAULT_PATH).split(":")]


_NOT_THERE: Final = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG)  # try the next PATH entry
_T = TypeVar("_T")


def exec_first(argv: tuple[str, ...], env: Mapping[str, str], start: Callable[[str], _T]) -> _T:
    """``start`` (an ``execve``, or a spawn of it) on the first ``PATH`` candidate that runs. A candidate ``stat``
    says is not there is skipped without trying it (``execve`` would fail the same way): under the connect-notify
    filter every ``execve`` is a round trip to the boundary (seccomp.NOTIFY_RULES), and ``true`` is in the fourth
    default entry."""
    denied: OSError | None = None
    search = "/" not in argv[0]
    for path in exec_candidates(argv[0], env):
        if search:
            try:
                os.stat(path)
            except OSError as exc:
                if exc.errno in _NOT_THERE:
                    continue
        try:
            return start(path)
        except OSError as exc:
            if exc.errno == errno.EACCES:
                denied = denied or exc
            elif exc.errno not in _NOT_THERE or not search:
                raise
    if denied is not None:
        raise denied
    raise FileNotFoundError(errno.ENOENT, f"{argv[0]}: not found in PATH")


def _execve(argv: tuple[str, ...], env: Mapping[str, str]) -> NoReturn:
    argv_list, env_dict = list(argv), dict(env)
    exec_first(argv, env, lambda path: os.execve(path, argv_list, env_dict))
    raise OSError(errno.EINVAL, "execve returned")  # unreachable: it replaces us or raises


@dataclass(frozen=True, slots=True)
class Confinement:
    """What a spare exec-init is made for: the ids its commands get, the Landlock rules, the deny list and
    whether the connect-notify filter is installed — the last three applied to the exec-init itself before any
    command exists (``SELF``). Equal confinements are what a lease is matched on."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    landlock: LandlockSpec | None
    seccomp: bool
    notify: bool

    def to_wire(self) -> dict[str, JsonValue]:
        return {
            "uid": self.uid,
            "gid": self.gid,
            "groups": list(self.groups),
            "landlock": _landlock_wire(self.landlock),
            "seccomp": self.seccomp,
            "notify": self.notify,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, JsonValue]) -> Confinement:
        """Strict as ``SpawnSpec.from_wire`` (whose fields these are), and ``notify`` must be a bool."""
        notify = data["notify"]
        if not isinstance(notify, bool):
            raise TypeError("notify must be a bool")
        return confinement(SpawnSpec.from_wire({"argv": [], "env": {}, "cwd": "/", **data}), notify)


class Failure(TypedDict):
    """A stage that failed, as the status pipe (or a spare's ready message) reports it (rule 2)."""

    stage: str
    errno: int
    detail: str


def confinement(spec: SpawnSpec, notify: bool) -> Confinement:
    """``spec``'s confinement, with ``notify`` for the connect-notify filter."""
    return Confinement(spec.uid, spec.gid, spec.groups, spec.landlock, spec.seccomp, notify)


def confinement_spec(confinement: Confinement) -> SpawnSpec:
    """A spec carrying only ``confinement`` (what the ``SELF`` stages read); no command to run."""
    return SpawnSpec((), {}, "/", confinement.uid, confinement.gid, confinement.groups,
                     landlock=confinement.landlock, seccomp=confinement.seccomp)  # fmt: skip


@dataclass
class ChildContext:
    """What the forking process hands its child: the spec and the fds it received for it."""

    spec: SpawnSpec
    stdio: tuple[int, int, int]
    status_fd: int
    parent_pid: int  # our parent as this child sees it (the PID-ns init is 1)
    notes: list[str] = field(default_factory=list)
    mount_ns: int | None = None  # fd of the agent's mount namespace, entered while still privileged
    notify_fd: int | None = None  # socket to the boundary: the connect-notify listener is sent over it
    # A spare exec-init (``SELF``): under the connect-notify filter, its listener kept here to pass on with its
    # first lease.
    keep_listener: bool = False
    listener: int | None = None


def _reset_signals(ctx: ChildContext) -> None:
    """Default dispositions and an empty mask (ignored signals would survive ``execve``).

    A child of an exec-init finds them default already (``default_dispositions``) and only empties its mask.
    Elsewhere the forking process set every disposition through ``signal.signal`` when it started, so Python's
    table is exact and only the ones it changed since (SIGPIPE ignored, SIGCHLD caught) cost a syscall here.
    Plain numbers are walked (``valid_signals`` makes an enum member of each, in a process that just forked)."""
    if not DISPOSITIONS_DEFAULT:
        _default_dispositions()
    if not RESERVED_SIGNALS_DEFAULT:
        linux.reset_reserved_signals()
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _default_dispositions() -> None:
    signal.set_wakeup_fd(-1)
    for sig in _CATCHABLE:
        try:
            if signal.getsignal(sig) != signal.SIG_DFL:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass


def default_dispositions() -> None:
    """Every catchable signal of the calling process to its default action and no wakeup fd, for good: a
    forking process that changes them no more (an exec-init) spares each child this walk (``DISPOSITIONS_DEFAULT``).
    """
    global DISPOSITIONS_DEFAULT
    _default_dispositions()
    DISPOSITIONS_DEFAULT = True


_CATCHABLE: Final = tuple(int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))
# Set by a forking process that put glibc's two signals back to default once for all its children (the
# workload's init): nothing of ours can change them again, so its children need not (a ctypes call each).
RESERVED_SIGNALS_DEFAULT: bool = False
# Set by ``default_dispositions``: every handler of ours is default already (a fork inherits dispositions).
DISPOSITIONS_DEFAULT: bool = False


def _mount_ns(ctx: ChildContext) -> None:
    """Enter a mount namespace handed over as an fd (needs CAP_SYS_CHROOT too); the fd is closed with the others.
    The boundary does not use it: its forking process enters the agent's root itself (rootfs.py rule 5)."""
    if ctx.mount_ns is not None:
        linux.setns(ctx.mount_ns, linux.CLONE_NEWNS)
        os.chdir("/")


def _ctty(ctx: ChildContext) -> None:
    if ctx.spec.tty:
        fcntl.ioctl(ctx.stdio[0], termios.TIOCSCTTY, 0)


def _stdio(ctx: ChildContext) -> None:
    # Lift everything above the targets first so no dup2 overwrites an fd still to be placed.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (*ctx.stdio, ctx.status_fd)]
    notify = None if ctx.notify_fd is None else fcntl.fcntl(ctx.notify_fd, fcntl.F_DUPFD_CLOEXEC, 10)
    for target, fd in enumerate(high[:3]):
        os.dup2(fd, target, inheritable=True)
    os.dup2(high[3], STATUS_FD, inheritable=False)
    ctx.status_fd = STATUS_FD
    if notify is not None:
        os.dup2(notify, NOTIFY_FD, inheritable=False)
        ctx.notify_fd = NOTIFY_FD


def _close_fds(ctx: ChildContext) -> None:
    linux.close_range(STATUS_FD + 1 if ctx.notify_fd is None else NOTIFY_FD + 1)


def _chdir(ctx: ChildContext) -> None:
    os.chdir(ctx.spec.cwd)


def _capbset(ctx: ChildContext) -> None:
    """The bounding and ambient sets emptied, and the inheritable set: nothing can come back at ``execve`` even
    where the ids do not change (a spare exec-init keeps its effective and permitted sets, ``spawn.py``)."""
    privilege.clear_bounding_set()
    privilege.clear_inheritable()


def _caps(ctx: ChildContext) -> None:
    if ctx.spec.uid != 0:
        privilege.clear_capabilities()


def _setuid0(ctx: ChildContext) -> None:
    if ctx.spec.uid != 0:
        privilege.verify_cannot_regain_root()


def _pdeathsig(ctx: ChildContext) -> None:
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != ctx.parent_pid:  # the parent died before the prctl took
        raise ProcessLookupError(errno.ESRCH, "parent exited during launch")


def _landlock(ctx: ChildContext) -> None:
    if ctx.spec.landlock is None:
        return
    for note in landlock.restrict_self(ctx.spec.landlock):
        if ctx.status_fd < 0:  # a spare: no status pipe yet, the notes go with its ready message
            ctx.notes.append(note)
        else:
            _write_status(ctx, {"note": note})


def _seccomp(ctx: ChildContext) -> None:
    if ctx.keep_listener:  # first: the deny list refuses seccomp(2) (docs/design.md "Identity")
        ctx.listener = seccomp.install_listener(seccomp.notify_program())
    elif ctx.notify_fd is not None:
        listener = seccomp.install_listener(seccomp.notify_program())
        hand_off = socket.socket(fileno=ctx.notify_fd)
        try:
            socket.send_fds(hand_off, [b"listener"], [listener])
        finally:
            hand_off.close()
            os.close(listener)
            ctx.notify_fd = None
    if ctx.spec.seccomp:
        seccomp.install(seccomp.program())


def _exec(ctx: ChildContext) -> None:
    _execve(ctx.spec.argv, ctx.spec.env)


STAGES: Final[tuple[tuple[Stage, Callable[[ChildContext], object]], ...]] = (
    (Stage.SIGNALS, _reset_signals),
    (Stage.MOUNT_NS, _mount_ns),
    (Stage.SETSID, lambda ctx: os.setsid()),
    (Stage.CTTY, _ctty),
    (Stage.STDIO, _stdio),
    (Stage.CLOSE_FDS, _close_fds),
    (Stage.UMASK, lambda ctx: os.umask(privilege.DEFAULT_CHILD_MODE)),
    (Stage.SETGROUPS, lambda ctx: privilege.set_groups(ctx.spec.groups)),
    (Stage.SETRESGID, lambda ctx: privilege.set_gid(ctx.spec.gid)),
    (Stage.CAPBSET, _capbset),
    (Stage.SETRESUID, lambda ctx: privilege.set_uid(ctx.spec.uid)),
    (Stage.CAPS, _caps),
    (Stage.SETUID0, _setuid0),
    (Stage.CHDIR, _chdir),
    (Stage.RLIMIT_CORE, lambda ctx: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))),
    (Stage.DUMPABLE, lambda ctx: linux.prctl(linux.PR_SET_DUMPABLE, 0)),
    (Stage.PDEATHSIG, _pdeathsig),
    (Stage.NO_NEW_PRIVS, lambda ctx: linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)),
    (Stage.LANDLOCK, _landlock),
    (Stage.SECCOMP, _seccomp),
    (Stage.EXECVE, _exec),
)


# A spare exec-init (zygote.py "Spares") applies the stages of ``SELF`` to itself, in table order, once and before
# any command exists: everything it forks or spawns inherits them, so its commands skip them (``IN_CHILD``: what a
# child it forks still runs; ``spawn.py``: the same for a command it starts with ``posix_spawn``). None of them
# changes its ids: it waits with the init's credentials, so the agent can neither signal nor trace it.
_SELF: Final = frozenset({
    Stage.UMASK, Stage.CAPBSET, Stage.RLIMIT_CORE, Stage.NO_NEW_PRIVS, Stage.LANDLOCK, Stage.SECCOMP,
})  # fmt: skip
SELF: Final = tuple((stage, action) for stage, action in STAGES if stage in _SELF)
IN_CHILD: Final = tuple((stage, action) for stage, action in STAGES if stage not in _SELF)


def _failure(stage: Stage, exc: BaseException) -> Failure:
    if isinstance(exc, OSError):
        return Failure(stage=stage.value, errno=exc.errno or errno.EINVAL, detail=exc.strerror or str(exc))
    return Failure(stage=stage.value, errno=errno.EINVAL, detail=repr(exc))  # a bug: still a report


def run_self(ctx: ChildContext) -> Failure | None:
    """The ``SELF`` stages, on the calling process (a spare exec-init); ``None`` once all ran, else the failure
    record."""
    stage = SELF[0][0]
    try:
        for current, action in SELF:
            stage = current
            action(ctx)
    except BaseException as exc:
        return _failure(stage, exc)
    return None


def _write_status(ctx: ChildContext, record: Mapping[str, Any]) -> None:
    data = (json.dumps(record) + "\n").encode()
    try:
        os.write(ctx.status_fd, data)
    except OSError:
        pass  # nobody to tell: the parent gave up on this launch


def run(ctx: ChildContext, stages: tuple[tuple[Stage, Callable[[ChildContext], object]], ...] = STAGES) -> NoReturn:
    """Run ``stages`` (every stage; a child of a spare exec-init: ``IN_CHILD``), then ``execve``; on failure
    report ``(stage, errno)`` and exit."""
    stage = stages[0][0]
    try:
        for current, action in stages:
            stage = current
            action(ctx)
        raise OSError(errno.EINVAL, "execve returned")  # unreachable: _exec either replaces us or raises
    except BaseException as exc:  # a bug must still end in a report, never in the parent's code
        fail(ctx, stage, exc)
    finally:
        os._exit(ExitCode.NOT_FOUND)


def report_failure(ctx: ChildContext, stage: Stage, exc: BaseException) -> None:
    """Write ``exc`` at ``stage`` to the status pipe (rule 2)."""
    _write_status(ctx, _failure(stage, exc))


def fail(ctx: ChildContext, stage: Stage, exc: BaseException) -> NoReturn:
    """Report ``exc`` at ``stage`` on the status pipe and exit (rule 2)."""
    try:
        report_failure(ctx, stage, exc)
    finally:
        os._exit(ExitCode.NOT_FOUND)  # the parent reads the status pipe, not this code
