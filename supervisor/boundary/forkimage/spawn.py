"""A spare exec-init's command started with ``posix_spawn``, not a fork of Python (zygote.py "Spares";
docs/reference/boundary.md §2.2).

Why: a forked interpreter pays for the memory it shares with its parent — every page Python writes before the
``execve`` (reference counts) is copied first, ~500 of them here, and the copy is torn down at ``execve`` — and the
parent refaults its own pages after. glibc's ``posix_spawn`` runs its child on the caller's memory
(``CLONE_VM | CLONE_VFORK``) in C: nothing is copied, and the call returns once the child's ``execve`` succeeded,
or with its errno.

Rules of this module:

1. Only in a spare exec-init that applied ``child.SELF`` to itself: the command inherits the umask, the empty
   bounding, ambient and inheritable sets, the core limit, ``no_new_privs``, Landlock and both seccomp filters.
   The rest of ``child.STAGES`` is done here, in table order: signals (the mask emptied; an exec-init's
   dispositions are default), ``setsid``, stdio (``dup2`` actions; every other fd of an exec-init is
   close-on-exec), the ids, ``chdir`` and ``execve``. Never with a terminal: ``TIOCSCTTY`` needs a forked child
   (``child.IN_CHILD``).
2. The ids are the exec-init's own for the length of the call: real and effective the spec's, saved its own
   (``setresuid(uid, uid, saved)``). So ``chdir`` and the ``PATH`` walk are checked with the agent's ids, as in a
   forked child after its drop (child.py rule 3), and the child, which shares the exec-init's credentials, execs
   with them: the kernel sets its saved ids to its effective ones and computes its capabilities from empty
   inheritable, ambient and bounding sets — none. Then the exec-init takes its ids back (its saved ones allow it)
   and is non-dumpable again; it does not go on with the agent's ids if that fails.
3. While the ids are the agent's the exec-init is stopped in the call (``CLONE_VFORK``) and its namespace holds no
   process of the agent's. A process of the agent's elsewhere could signal it, or lower its priority, in that
   window (its real uid is the agent's) — what it could do to the command anyway — but never trace it: the saved
   uid is not the agent's and the process is not dumpable (the kernel clears it when the effective uid changes).
4. No ``PR_SET_PDEATHSIG``: the exec-init is PID 1 of the command's namespace, whose end kills the command.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from . import child, linux, privilege
from .child import Stage


class StageFailure(Exception):
    """A launch that failed at ``stage`` before the command ran (the status pipe's record, child.py rule 2)."""

    def __init__(self, stage: Stage, error: OSError) -> None:
        super().__init__(stage, error)
        self.stage = stage
        self.error = error


def launch(ctx: child.ChildContext, started: Callable[[], None] = lambda: None) -> int:
    """Start ``ctx.spec``'s command on ``ctx.stdio`` (rule 1); its pid. Raises ``StageFailure``. ``started`` runs
    as soon as the command has exec'd, before our ids come back: closing our copy of its status pipe there tells
    the boundary now (the restore is ours alone, and if it fails we end, which ends the command too)."""
    spec = ctx.spec
    if spec.tty:
        raise StageFailure(Stage.CTTY, OSError(errno.EINVAL, "a terminal needs a forked child"))
    uid, gid, groups = os.geteuid(), os.getegid(), os.getgroups()
    stage = Stage.SETGROUPS
    try:
        try:
            privilege.set_groups(spec.groups)
            stage = Stage.SETRESGID
            os.setresgid(spec.gid, spec.gid, gid)
            if os.getresgid() != (spec.gid, spec.gid, gid):
                raise PermissionError(errno.EPERM, "gid did not take")
            stage = Stage.SETRESUID
            os.setresuid(spec.uid, spec.uid, uid)
            if os.getresuid() != (spec.uid, spec.uid, uid):
                raise PermissionError(errno.EPERM, "uid did not take")
            stage = Stage.CAPS
            _check_capabilities(spec.uid, uid)
            stage = Stage.CHDIR
            os.chdir(spec.cwd)
            stage = Stage.EXECVE
            argv, env = list(spec.argv), dict(spec.env)
            dup2 = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(ctx.stdio)]
            pid = child.exec_first(
                spec.argv,
                spec.env,
                lambda path: os.posix_spawn(path, argv, env, file_actions=dup2, setsid=True, setsigmask=()),
            )
            started()
            return pid
        finally:
            _restore(uid, gid, groups)
    except OSError as exc:
        raise StageFailure(stage, exc) from None


def _check_capabilities(uid: int, own: int) -> None:
    """What the command's capabilities are computed from at ``execve``: the inheritable set must be empty (the
    ambient and bounding sets were emptied by ``SELF``), and a drop from root must have cleared the effective set."""
    effective, _permitted, inheritable = linux.capget()
    if inheritable or (own == 0 and uid != 0 and effective):
        raise PermissionError(errno.EPERM, "capabilities remain for the command")


def _restore(uid: int, gid: int, groups: list[int]) -> None:
    """The exec-init's own ids again (rule 2), or its end."""
    try:
        os.setresuid(uid, uid, uid)
        os.setresgid(gid, gid, gid)
        if sorted(os.getgroups()) != sorted(groups):
            os.setgroups(groups)
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
            raise PermissionError(errno.EPERM, "the exec-init's ids did not come back")
        linux.prctl(linux.PR_SET_DUMPABLE, 0)
    except BaseException:
        os._exit(1)
