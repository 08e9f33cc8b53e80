"""The egress capture that attach sets up: its listeners, the identity resolver and the connect notifier.

In netns mode the listeners are the ones the launcher made inside the agent's namespace; in proxy-env one HTTP
proxy listener in our own (the pod's) namespace. The capture starts accepting at confirm (boundary/fence.py).
"""

from __future__ import annotations

import contextlib
import os
import socket

from supervisor.boundary.capture import connect_notify
from supervisor.boundary.capture.connect_record import ConnectRecords, ExecLog, live_bound
from supervisor.boundary.capture.identity import IdentityResolver
from supervisor.boundary.capture.setup import open_sock_diag
from supervisor.boundary.config import PROXY_PORT
from supervisor.boundary.egress import EgressCapture, RecentPids
from supervisor.boundary.state import DaemonState
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.lifecycle import State
from supervisor.protocol.privilege_model import PrivilegeModel

# Identity must resolve within this much of the resolving thread's CPU time (spec §4.2: 50 ms), first-time
# hashing of a binary excluded; typically 0.2-3 ms. CPU, not wall time: waiting for the GIL under load is not
# the workload's doing.
IDENTITY_BUDGET_US = 50_000
CONNECT_NOTIFY_OFF_ENV = "OPENSHELL_BENCH_NO_CONNECT_NOTIFY"  # "1": accept-time identity only (bench baseline)


def start_capture(state: DaemonState, netns: bool) -> bool:
    """Make ``state.capture`` for the attached workload; True when identity is fixed at connect (else at
    accept)."""
    fds, anchor = _listener_fds(state, netns)
    diag_fd = fds.pop("sock_diag", None)
    recent_pids = RecentPids(state.launcher.workload_pids)
    at_connect = _identity_at_connect(state.cfg.privilege_model)
    resolver = _resolver(state, anchor, recent_pids, diag_fd, at_connect)
    if at_connect:
        _serve_connect_notify(state, resolver)
    state.capture = EgressCapture(
        fds=fds, links=state.egress_links, resolver=resolver, log=state.log, recent_pids=recent_pids,
        accepting=lambda: state.lifecycle.state is not State.ENDED,
    )  # fmt: skip
    return at_connect


def _listener_fds(state: DaemonState, netns: bool) -> tuple[dict[str, int], int]:
    """The capture's listeners by name, and the pid whose network namespace they are in."""
    if netns:
        assert state.prepared is not None
        return dict(state.prepared.fds), state.launcher.pid
    # proxy-env: one proxy listener in our own (the pod's) network namespace
    fds = {"proxy": _proxy_listener()}
    with contextlib.suppress(OSError):
        fds["sock_diag"] = open_sock_diag()
    return fds, os.getpid()


def _identity_at_connect(model: PrivilegeModel) -> bool:
    """Identity fixed at connect (docs/design.md "Identity"): where the kernel has seccomp user notification
    and we may take a workload process's fds (pidfd_getfd needs ptrace rights over it: R, U, or root); else the
    accept-time resolution and its documented window. The bench's baseline turns it off."""
    return (
        (model != PrivilegeModel.P or os.geteuid() == 0)
        and os.environ.get(CONNECT_NOTIFY_OFF_ENV) != "1"
        and connect_notify.available()
    )


def _resolver(
    state: DaemonState, anchor: int, recent_pids: RecentPids, diag_fd: int | None, at_connect: bool
) -> IdentityResolver:
    table = state.table
    return IdentityResolver(
        anchor_pid=anchor,
        workload_pids=recent_pids,
        agent_pid=lambda: table.agent.pid if table.agent is not None else None,
        # With a workload PID namespace no process outside it can hold one of its sockets except ourselves
        # and the launcher, so the walk of every fd table for foreign owners is not needed. Without one (P)
        # it is, over our PID namespace: as a container's PID 1 that is just the pod. Outside a container
        # (dev mode's model P) it would be every process on the host, tens of ms per connection: skipped,
        # one of dev-P's documented limits.
        scan_foreign=state.cfg.privilege_model == PrivilegeModel.P and os.getpid() == 1,
        budget_us=IDENTITY_BUDGET_US,
        sock_diag=socket.socket(fileno=diag_fd) if diag_fd is not None else None,
        records=ConnectRecords() if at_connect else None,
        exec_log=ExecLog(limit=live_bound(state.limits.pids_limit())) if at_connect else None,
    )


def _serve_connect_notify(state: DaemonState, resolver: IdentityResolver) -> None:
    """Serve the connect notifier (capture/connect_notify.py); the launcher is given its child end."""
    notifier = connect_notify.ConnectNotifier(resolver, on_event=lambda name, fields: state.log.emit(name, **fields))
    state.launcher.notify_socket = notifier.child_end()
    state.launcher.first_execs = notifier.first_execs
    assert state.nursery is not None
    state.nursery.start_soon(notifier.serve)


def _proxy_listener() -> int:
    """The HTTP proxy listener for proxy-env mode, on the pod's loopback (never SO_REUSEPORT)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", PROXY_PORT))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        reason = f"cannot listen on 127.0.0.1:{PROXY_PORT}: {exc.strerror}"
        raise OpError(ErrorKind.FAILED, reason, stage="attach") from None
    return sock.detach()
