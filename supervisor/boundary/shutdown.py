"""How the boundary daemon ends: on the agent's exit (after control acknowledged its result, or the linger), on
the first SIGTERM or SIGINT, or after a failed step (``DaemonState.fatal``). Every workload process is ended
first; the workload's cgroups are removed last (docs/reference/boundary.md §1.6).
"""

from __future__ import annotations

import signal

import trio

from supervisor.boundary.process import LauncherError
from supervisor.boundary.state import REPLY_FLUSH_S, DaemonState
from supervisor.protocol.event_names import EventName
from supervisor.protocol.exit_codes import ExitCode, for_signal

END_WORKLOAD_S = 5.0


class Shutdown:
    """The daemon's ending: its signals, the agent's exit, and what is released after its nursery."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state

    async def signals(self, nursery: trio.Nursery) -> None:
        """The first SIGTERM or SIGINT ends the workload and then the daemon; later ones are logged and taken
        here until the end (Ctrl-C on dev reaches us with dev's own SIGTERM right behind: a receiver closed with
        one pending would deliver it to the default action, killing us before the agent's result is recorded
        and its cgroups removed)."""
        state = self.state
        ending = False
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                state.log.emit(EventName.BOUNDARY_SIGNAL, signal=signal.Signals(signum).name)
                if ending:
                    continue
                ending = True
                agent_running = state.table.agent is not None and state.table.agent.result is None
                await self._end_workload("shutdown")
                if agent_running:
                    # watch_agent records the agent's result and ends the daemon; no ack will come now.
                    state.exit_acked.set()
                    continue
                state.exit_code = for_signal(signum)
                nursery.cancel_scope.cancel()

    async def _end_workload(self, reason: str) -> None:
        """Terminate every workload process; never let a stuck launcher keep the daemon from exiting."""
        state = self.state
        with trio.move_on_after(END_WORKLOAD_S) as scope:
            try:
                await state.table.end_all(reason)
            except LauncherError as exc:
                state.log.emit(EventName.BOUNDARY_END_ALL_FAILED, reason=str(exc))
        if scope.cancelled_caught:
            state.log.emit(EventName.BOUNDARY_END_ALL_TIMEOUT, seconds=END_WORKLOAD_S)

    async def watch_agent(self, nursery: trio.Nursery) -> None:
        state = self.state
        await state.table.agent_exited.wait()
        agent = state.table.agent
        assert agent is not None
        result = await agent.wait_result()
        state.lifecycle.end()
        state.exit_code = result.exit_code
        state.log.emit(EventName.AGENT_EXITED, handle=agent.handle, result=result.to_wire())
        await self._end_workload("agent-exit")
        with trio.move_on_after(state.cfg.exit_linger_s) as scope:
            await state.exit_acked.wait()
        if scope.cancelled_caught:
            state.log.emit(EventName.BOUNDARY_EXIT_LINGER_EXPIRED, linger_s=state.cfg.exit_linger_s)
        with trio.move_on_after(END_WORKLOAD_S):  # a terminate racing the exit answers the agent's result
            while state.terminating:
                await state.terminates_done.wait()
        with trio.move_on_after(REPLY_FLUSH_S):  # the acknowledgement's (or a terminate's) reply goes out first
            await state.router.replies_flushed()
        nursery.cancel_scope.cancel()

    def finish(self) -> int:
        """After the daemon's nursery: remove the workload's cgroups; the daemon's exit code."""
        state = self.state
        code = state.exit_code if state.exit_code is not None else ExitCode.SELF_FAILED
        state.limits.release(state.launcher, wait_s=END_WORKLOAD_S)
        state.log.emit(EventName.BOUNDARY_EXIT, code=code)
        return code
