"""The workload's processes as control drives them: ``start`` launches the agent; ``exec``, ``attach-stream``,
``forward``, ``wait``, ``signal`` and ``terminate`` act on it and on the execs beside it (docs/reference/boundary.md
§1.2, §2).

Every launch's spec shares the managed environment, the Landlock rules and ``HOME``: made once per attach and
kept (each was ~60 µs of every exec's path).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import trio

from supervisor.boundary.confinement import landlock_for
from supervisor.boundary.forkimage.landlock import LandlockSpec
from supervisor.boundary.forkimage.rootfs import TRUST_PATH, under
from supervisor.boundary.forward import open_forward
from supervisor.boundary.process.environment import account, build_process_spec, managed_env
from supervisor.boundary.process.exec_session import pump_exec
from supervisor.boundary.state import DaemonState
from supervisor.link.h2link import LinkStream
from supervisor.link.relay import relay
from supervisor.link.rpc import Accept
from supervisor.protocol.acks import NoArguments
from supervisor.protocol.agent_ended import why_ended
from supervisor.protocol.channel_ops import AttachStreamRequest, ExecAccepted, ForwardAccepted, ForwardRequest
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_codes import for_launch_errno
from supervisor.protocol.exit_result import ExitResult
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.lifecycle import Op, StartReply
from supervisor.protocol.privilege_model import PrivilegeModel
from supervisor.protocol.process_ops import (
    ExecRequest,
    SignalReply,
    SignalRequest,
    TerminateRequest,
    WaitRequest,
    parse_exec_request,
    refuse_reserved_port,
)


class WorkloadOps:
    """``/v1/start`` (Ready to Running) and the process operations on the running workload."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state
        self._env_memo: tuple[object, Mapping[str, str]] | None = None
        self._landlock_memo: tuple[object, int, LandlockSpec] | None = None

    async def op_start(self, req: NoArguments) -> StartReply:
        state = self.state
        state.lifecycle.check(Op.START)
        assert state.attach is not None
        uid, gid = state.agent_ids(state.attach)
        # an exec request's body, checked as control's are (parse_exec_request)
        agent: dict[str, JsonValue] = {"argv": list(state.cfg.agent_argv), "cwd": state.cfg.workdir, "tty": False}
        if state.cfg.agent_stdio == "tty":  # its own terminal, streamed to whoever attaches (dev mode's terminal)
            cols, rows = state.cfg.agent_tty_size
            agent.update(tty=True, cols=cols, rows=rows, env={"TERM": state.cfg.agent_term})
        request = parse_exec_request(agent)
        spec = build_process_spec(
            request, agent_uid=uid, agent_gid=gid, managed_env=self._managed_env(), default_cwd=state.cfg.workdir,
            landlock=self._landlock(uid), home=self._home(uid),
            provider_env=state.attach.credential_placeholders,
        )  # fmt: skip
        if state.cfg.agent_stdio == "inherit":
            spec = dataclasses.replace(spec, stdin="inherit", stdout="inherit", stderr="inherit")
        try:
            entry = await state.table.start(spec, kind="agent")
        except OpError as exc:
            state.lifecycle.end()
            state.exit_code = for_launch_errno(exc.errno)
            state.log.emit(EventName.AGENT_LAUNCH_FAILED, error=exc.to_json(), exit_code=state.exit_code,
                           program=state.cfg.agent_argv[0])  # fmt: skip
            state.end_soon()
            raise
        state.lifecycle.advance(Op.START)
        state.log.emit(EventName.LIFECYCLE_RUNNING, agent=entry.handle, argv=list(state.cfg.agent_argv))
        return StartReply(state.lifecycle.state, entry.handle)

    async def op_exec(self, request: ExecRequest, stream: LinkStream, accept: Accept) -> None:
        """After ``lifecycle.check(Op.EXEC)`` (the router's ``before``)."""
        state = self.state
        assert state.attach is not None
        uid, gid = state.agent_ids(state.attach)
        spec = build_process_spec(
            request, agent_uid=uid, agent_gid=gid, managed_env=self._managed_env(), default_cwd=state.cfg.workdir,
            landlock=self._landlock(uid), home=self._home(uid),
            provider_env=state.attach.credential_placeholders,
        )  # fmt: skip
        entry = await state.table.start(spec, kind="exec", timeout_s=request.timeout_s, grace_s=request.grace_s)
        await accept(ExecAccepted(entry.handle, entry.tty))
        await pump_exec(entry, stream)

    async def op_attach_stream(self, req: AttachStreamRequest, stream: LinkStream, accept: Accept) -> None:
        """Re-attach to an exec's output after its client or control went away (spec §2.3): the buffered tail
        (a ``lagged`` frame first if some was dropped), then live output, then ``exit``. An agent with a terminal
        of its own (``--agent-stdio=tty``) is attached the same way: that is how dev mode's terminal reaches it.
        After ``lifecycle.check(Op.EXEC)`` (the router's ``before``)."""
        entry = self.state.table.entry(req.handle)
        if entry.output is None or (entry.kind != "exec" and not entry.tty):
            raise OpError(ErrorKind.INVALID, "only an exec's or a terminal agent's output can be attached", "handle")
        if entry.output.attached:
            raise OpError(ErrorKind.UNAVAILABLE, "a stream is already attached to this process", field="handle")
        await accept(ExecAccepted(entry.handle, entry.tty))
        await pump_exec(entry, stream)

    async def op_forward(self, req: ForwardRequest, stream: LinkStream, accept: Accept) -> None:
        """After ``lifecycle.check(Op.FORWARD)`` (the router's ``before``)."""
        state = self.state
        target = req.target
        refuse_reserved_port(target.port, state.reserved_ports())
        if req.probe:  # `forward`'s start-up question: would this target be accepted? No connection
            await accept(ForwardAccepted(target.host, target.port, probe=True))
            return
        local = await open_forward(state.launcher, target.host, target.port, state.reserved_ports())
        await accept(ForwardAccepted(target.host, target.port))
        stats = await relay(stream, local, idle_timeout=math.inf)
        state.log.emit(
            EventName.FORWARD_CLOSED, host=target.host, port=target.port, bytes_in=stats.bytes_a_to_b,
            bytes_out=stats.bytes_b_to_a, closed_by=str(stats.closed_by),
        )  # fmt: skip

    async def op_wait(self, req: WaitRequest) -> ExitResult:
        """After ``lifecycle.check(Op.WAIT)`` (the router's ``before``)."""
        return await self.state.table.wait(req.handle, req.timeout_s)

    async def op_signal(self, req: SignalRequest) -> SignalReply:
        """After ``lifecycle.check(Op.SIGNAL)`` (the router's ``before``)."""
        self.state.table.signal(req.handle, req.signal, str(req.scope))
        return SignalReply(req.handle, req.signal)

    async def op_terminate(self, req: TerminateRequest) -> ExitResult:
        state = self.state
        try:
            state.lifecycle.check(Op.TERMINATE)
        except OpError as exc:
            # The agent had already ended: terminated (§1.3-1.4), with what ended it.
            raise self._agent_already_ended(req.handle) or exc from None
        state.terminating += 1
        try:
            return await state.table.terminate(req.handle, req.grace_s)
        except OpError as exc:
            raise self._agent_already_ended(req.handle) or exc from None  # it exited on its own meanwhile
        finally:
            state.terminating -= 1
            if not state.terminating:
                state.terminates_done.set()
                state.terminates_done = trio.Event()

    def _agent_already_ended(self, handle: str) -> OpError | None:
        """``terminated`` carrying the agent's result when ``handle`` is the agent's and it has ended."""
        agent = self.state.table.agent
        if agent is None or agent.handle != handle or agent.result is None:
            return None
        return OpError(ErrorKind.TERMINATED, f"terminate: {why_ended(agent.result)} already", field="handle",
                       result=agent.result)  # fmt: skip

    def _managed_env(self) -> Mapping[str, str]:
        """CA env at the fixed path in R and U (a read-only bind of our tls dir); in P where we wrote them."""
        state = self.state
        if self._env_memo is not None and self._env_memo[0] is state.trust:
            return self._env_memo[1]
        if state.trust is None:
            env = managed_env(ca_cert=None, ca_bundle=None)
        else:
            ca_path, bundle_path = state.trust
            if state.cfg.privilege_model != PrivilegeModel.P:
                ca_path, bundle_path = Path(TRUST_PATH) / ca_path.name, Path(TRUST_PATH) / bundle_path.name
            env = managed_env(ca_cert=str(ca_path), ca_bundle=str(bundle_path))
        self._env_memo = (state.trust, MappingProxyType(env))
        return self._env_memo[1]

    def _home(self, uid: int) -> str | None:
        """``HOME``: the account's, unless the agent's own root (R, U) leaves it out; then the workdir."""
        state = self.state
        if state.cfg.privilege_model == PrivilegeModel.P:
            return None
        found = account(uid)
        if found is None:
            return None  # no account: the environment falls back to the workdir already
        home = found[1]
        assert state.attach is not None
        fs = state.attach.static_policy.filesystem
        writable = [state.cfg.workdir, *(fs.read_write if fs is not None else ())]
        return None if any(under(home, path) for path in writable) else state.cfg.workdir

    def _landlock(self, uid: int) -> LandlockSpec:
        state = self.state
        assert state.attach is not None
        if self._landlock_memo is not None and self._landlock_memo[0] is state.attach and self._landlock_memo[1] == uid:
            return self._landlock_memo[2]
        spec = landlock_for(
            state.attach.static_policy, state.cfg.workdir, model=state.cfg.privilege_model, agent_uid=uid,
            trust_dir=str(state.cfg.tls_dir) if state.cfg.privilege_model == PrivilegeModel.P else None,
        )  # fmt: skip
        if state.cfg.test_landlock_off:
            spec = dataclasses.replace(spec, mode="off")
        self._landlock_memo = (state.attach, uid, spec)
        return spec
