"""PID 1 of one exec's own PID namespace: the exec-init, forked for one command (``exec_init``) or ahead of
its exec as a spare that serves one command after another (``spare_main``; zygote.py's docstring, "Spares")."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import signal
import socket
import time
from collections.abc import Callable
from typing import Final, NoReturn

from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.json_value import JsonValue

from . import capabilities, child, linux, spawn
from .messages import Ready, SpareBack, SpawnRequest
from .procstate import keep_fds
from .spawn_fds import stdio_fds
from .wire import close_all, receive, send, socket_pair

SPARE_BUSY_S: Final = 0.5  # a spare's exec running longer than this no longer counts: the init makes another

_FORWARDED: Final = tuple(
    s for s in signal.valid_signals()
    if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD) and s < signal.SIGRTMIN
)  # fmt: skip
_WAITED: Final = frozenset({*_FORWARDED, signal.SIGCHLD})  # what an exec-init waits for (sigwaitinfo)


def exec_init(ctx: child.ChildContext, report_r: int, report_w: int) -> NoReturn:  # pragma: no cover - own pid ns
    """PID 1 of one exec's own PID namespace (docs/design.md "Limits"): fork the command (``child.run``), forward every
    catchable signal to it, reap everything, and when the command ends write its raw wait status to
    ``report_w`` and exit — the kernel then kills whatever it left in the namespace (setsid, double forks).
    SIGKILL to this process (terminate's last step) ends the namespace, the command included. (A spare's is
    ``spare_main``.)"""
    try:
        if report_r >= 0:
            os.close(report_r)
        try:
            _become_exec_init()
        except OSError as exc:
            child.fail(ctx, child.Stage.CAPS, exc)
        ctx.parent_pid = os.getpid()  # our copy (a fork): the caller's object is not touched
        pid = os.fork()
        if pid == 0:
            os.close(report_w)
            child.run(ctx)
        # Every fd but the report: the command's ends (EOF on its pipes once it and its children are done), and
        # what we inherited from the init (its socket to the zygote, the host procfs).
        if report_w > 3:
            linux.close_range(3, report_w - 1)
        linux.close_range(report_w + 1)
        status = _wait_command(pid)
        _empty_namespace()
        with contextlib.suppress(OSError):
            os.write(report_w, str(status).encode())
        os._exit(0)
    finally:
        os._exit(1)


# Model R: what an exec-init keeps of the init's capabilities (capabilities.EXEC_INIT_KEEPS); set by the init
# (init.py) before it forks one.
EXEC_INIT_KEEPS: int | None = None


def _become_exec_init() -> None:  # pragma: no cover - an exec-init
    if EXEC_INIT_KEEPS is not None:  # first: no SYS_ADMIN while it serves the agent's commands
        capabilities.restrict(EXEC_INIT_KEEPS)
    os.setsid()  # a group of our own: a group signal to this handle never reaches the workload's init
    # Signals are taken with sigwaitinfo, not caught: no handler per signal to install here (and none for the
    # command's SIGNALS stage to reset). Blocked first; then what the init ignores or catches goes back to
    # default, since an ignored signal is dropped even while blocked (and a blocked one is never acted on).
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)  # a forked command inherits this mask; SIGNALS empties it
    child.default_dispositions()  # and no wakeup fd (the init's pipe is not ours): its children skip both


_STATE_W: Final = 5  # a spare's state pipe to the init: "t" once its exec runs long, "b" when it is back


def _wait_command(pid: int, on_long: Callable[[], None] | None = None) -> int:  # pragma: no cover - an exec-init
    """Forward every signal but SIGCHLD to ``pid`` until it ends; its raw wait status (other children, the
    command's orphans, are reaped on the way). ``on_long`` is called once if it runs SPARE_BUSY_S."""
    deadline = None if on_long is None else time.monotonic() + SPARE_BUSY_S
    while True:
        if deadline is None:
            signum = signal.sigwaitinfo(_WAITED).si_signo
        else:
            info = signal.sigtimedwait(_WAITED, max(0.0, deadline - time.monotonic()))
            if info is None:
                deadline = None
                assert on_long is not None
                on_long()
                continue
            signum = info.si_signo
        if signum != signal.SIGCHLD:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
            continue
        while True:  # SIGCHLDs coalesce: reap all that are done
            try:
                got, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(1)
            if got == 0:
                break
            if got == pid:
                return status


def _empty_namespace() -> None:  # pragma: no cover - an exec-init, PID 1 of its namespace
    """End and reap whatever the command left in our namespace (setsid, double forks) before the report goes
    out, so a report means the exec is over: its reader need not wait for our own exit (``kill(-1)`` from a
    namespace's init reaches every other process in it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def spare_main(  # pragma: no cover - own pid ns
    sock_fd: int, report_w: int, state_w: int, confinement: child.Confinement, ctx: child.ChildContext
) -> NoReturn:
    """PID 1 of a PID namespace made ahead of its exec (``Spawner.replenish``): a spare exec-init. It confines
    itself for ``confinement`` (``child.SELF``: Landlock, ``no_new_privs``, both seccomp filters, the umask, the
    capability sets and the core limit, all inherited by its commands), tells the init it is ready on the command
    socket (``{"ready": true, "notes"}`` with the connect-notify listener, or ``{"ready": false}`` with the failed
    stage), then serves the boundary's commands one at a time (``_serve``).

    It holds the command socket (fd 3), the report socket (fd 4) and the state pipe to the init (fd 5). It is not
    dumpable and waits with the init's credentials: only the boundary's side can signal it (root, or the user
    namespace's owner; the agent has no capability and another uid)."""
    try:
        # The init's process state but its fds (its 0-2 are /dev/null already).
        keep_fds([sock_fd, report_w, state_w])
        linux.prctl(linux.PR_SET_DUMPABLE, 0)
        _become_exec_init()
        ctx.parent_pid = os.getpid()
        failure = child.run_self(ctx)
        signals = linux.signalfd(_FORWARDED)  # what ends us while we wait (``_await_command``)
        sock = socket.socket(fileno=3)
        listener = [] if ctx.listener is None else [ctx.listener]
        ctx.listener = None
        if failure is None:
            ready = Ready(True, notes=tuple(ctx.notes))
        else:
            ready = Ready(False, errno=failure["errno"], stage=failure["stage"], detail=failure["detail"])
        send(sock, ready.to_wire(), listener)
        close_all(listener)
        if failure is None:
            _serve(ctx, confinement, sock, socket.socket(fileno=4), signals)
    finally:
        os._exit(1)


def _serve(  # pragma: no cover - a spare exec-init
    ctx: child.ChildContext, confinement: child.Confinement, sock: socket.socket, report: socket.socket, signals: int
) -> NoReturn:
    """A spare's life: take the command the boundary sends on ``sock`` (``_await_command``; none: we end), run
    it (``_run``), and once it ended and our namespace is empty, send its raw status on the report socket and
    lease ourselves again over it: ``{"spare": true, "notes"}`` with a new command socket (no listener: the
    boundary has ours since the first lease). One namespace serves one exec handle at a time, and no fork of the
    init or of a new exec-init is made per exec."""
    notes = list(ctx.notes)
    while True:
        got = _await_command(sock, signals)
        if got is None:
            os._exit(0)
        ran_long: list[bool] = []
        status = _run(ctx, confinement, *got, functools.partial(_tell_long, ran_long), sock)
        _empty_namespace()
        try:
            report.send(str(status).encode(), socket.MSG_NOSIGNAL)
            sock, theirs = socket_pair()
            try:
                send(report, SpareBack(tuple(notes)).to_wire(), [theirs.fileno()])
            finally:
                theirs.close()
            if ran_long:
                os.write(_STATE_W, b"b")
        except OSError:
            os._exit(0)  # the boundary is gone: the init replaces this spare


# Signals whose default action would not end a process: a spare that waits for its command is left alone by them.
_LEFT_ALONE: Final = frozenset({
    signal.SIGCONT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGURG, signal.SIGWINCH,
})  # fmt: skip


def _await_command(
    sock: socket.socket, signals: int
) -> tuple[dict[str, JsonValue], list[int]] | None:  # pragma: no cover
    """The next command on ``sock``, or ``None``: EOF (the boundary let the spare go), or a signal from the
    boundary's side (end-all's SIGTERM) whose default action would end a process. As PID 1 of its namespace a
    spare exec-init is spared every signal it neither catches nor blocks; it blocks them (``_WAITED``), so a
    signalfd (``signals``) says when one is pending while it waits."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(signals, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == signals:
                if any(signum not in _LEFT_ALONE for signum in linux.read_signals(signals)):
                    return None
            else:
                try:
                    return receive(sock)
                except OSError:
                    return None


def _tell_long(ran_long: list[bool]) -> None:  # pragma: no cover - a spare exec-init
    """Our exec has run SPARE_BUSY_S: tell the init, which makes another spare (an interactive shell must not
    hold one); "b" follows when we are back."""
    with contextlib.suppress(OSError):
        os.write(_STATE_W, b"t")
        ran_long.append(True)


def _run(  # pragma: no cover - a spare exec-init
    ctx: child.ChildContext,
    confinement: child.Confinement,
    request: dict[str, JsonValue],
    fds: list[int],
    on_long: Callable[[], None],
    sock: socket.socket,
) -> int:
    """One command: checked as the init checks a spawn's, its confinement the one we applied to ourselves; then
    started with ``posix_spawn`` (``spawn.launch``), or with a terminal in a forked child that runs what is left
    of the stages (``child.IN_CHILD``). A terminal is opened here, in the agent's mount namespace, and its master
    sent back on the command socket ``sock`` (closed here) before the command starts (terminal.py). Its raw wait
    status, or 127's where it did not start (the failure is on its status pipe, as a forked child reports it)."""
    try:
        try:
            req = SpawnRequest.from_wire(request)
            spec = child.SpawnSpec.from_wire(req.spec)
            ctx.stdio, ctx.status_fd, master = stdio_fds(req, fds, spec)
        except (KeyError, TypeError, ValueError):
            close_all(fds)
            return ExitCode.NOT_FOUND << 8
        except OSError as exc:
            if len(req.stdio) == 1 and 0 <= req.stdio[0] < len(fds):
                ctx.status_fd = fds[req.stdio[0]]
                child.report_failure(ctx, child.Stage.STDIO, exc)
            close_all(fds)
            return ExitCode.NOT_FOUND << 8
        if master is not None:  # the slave is in fds: ours is closed once the command has it
            try:
                send(sock, {"pty": True}, [master])
            except OSError as exc:
                child.report_failure(ctx, child.Stage.STDIO, exc)
                close_all(fds)
                return ExitCode.NOT_FOUND << 8
            finally:
                os.close(master)
    finally:
        sock.close()
    ctx.spec, ctx.notes = spec, []
    try:
        if child.confinement(spec, ctx.keep_listener) != confinement:
            raise spawn.StageFailure(
                child.Stage.VALIDATE, PermissionError(errno.EPERM, "the spare was prepared for another confinement")
            )
        if spec.tty:
            pid = os.fork()
            if pid == 0:
                child.run(ctx, child.IN_CHILD)
        else:
            pid = spawn.launch(ctx, started=functools.partial(close_all, fds))
    except spawn.StageFailure as failed:
        child.report_failure(ctx, failed.stage, failed.error)
        return ExitCode.NOT_FOUND << 8
    except OSError as exc:  # the fork
        child.report_failure(ctx, child.Stage.FORK, exc)
        return ExitCode.NOT_FOUND << 8
    finally:
        close_all(fds)  # our copies of its stdio and status pipe: EOF on the latter now means it execs
    return _wait_command(pid, on_long)
