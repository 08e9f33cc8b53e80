"""What every process operation answers once the agent has ended (docs/reference/boundary.md §1.3–1.4, §1.6).

The agent's exit (or the loss of enforcement, which kills it) ends the sandbox: the boundary reports the result
to control and exits once control has acknowledged it. From then on control answers for the sandbox from the
last result it was told, whether or not the boundary is still there to ask.

Rules this module enforces:

1. ``wait`` on the agent's handle answers its result, the same object every time (§2.5); ``terminate`` on it is
   ``terminated`` (410, §1.3–1.4: there is nothing left to end) carrying that result, as the boundary answers it.
2. ``wait`` on another handle (an exec's) is the boundary's to answer while it is attached (it keeps exec results
   for a while); once it has gone nothing else is kept: ``terminated``.
3. Every other operation — ``exec``, ``forward``, re-attaching a stream, ``signal``, ``terminate`` of another
   handle — is ``terminated`` (410), and the reason names what ended the agent.
"""

from __future__ import annotations

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.exit_result import ExitResult
from supervisor.protocol.lifecycle import Op

__all__ = ["after_agent_end", "why_ended"]


def why_ended(result: ExitResult) -> str:
    """``the agent has terminated: reason enforcement-lost (signal KILL)``: what a refusal says."""
    if result.signal is not None:
        how = f"signal {result.signal}"
    elif result.code is not None:
        how = f"code {result.code}"
    else:
        how = f"exit {result.exit_code}"
    return f"the agent has terminated: reason {result.reason} ({how})"


def after_agent_end(op: Op, handle: str | None, result: ExitResult, *, boundary_attached: bool) -> ExitResult | None:
    """The answer to ``op`` on ``handle`` after the agent ended with ``result``: that result (rule 1, ``wait``),
    ``None`` when the boundary still attached should answer (rule 2), else raises ``terminated`` (rules 1-3)."""
    agents = handle is not None and handle == result.handle
    if op is Op.WAIT and agents:
        return result
    if op is Op.TERMINATE and agents:
        raise OpError(ErrorKind.TERMINATED, f"terminate: {why_ended(result)} already", field="handle",
                      result=result)  # fmt: skip
    if op is Op.WAIT and boundary_attached:
        return None
    field = "handle" if op in (Op.WAIT, Op.SIGNAL, Op.TERMINATE) else None
    if op is Op.WAIT:
        raise OpError(ErrorKind.TERMINATED, f"wait: {why_ended(result)}; only its result is kept", field=field)
    if op in (Op.EXEC, Op.FORWARD):
        raise OpError(ErrorKind.TERMINATED, f"{op}: {why_ended(result)}; nothing can be started")
    raise OpError(ErrorKind.TERMINATED, f"{op}: {why_ended(result)}", field=field)
