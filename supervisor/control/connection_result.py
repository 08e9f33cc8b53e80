"""One egress connection's outcome, recorded exactly once (after ztunnel's ``ConnectionResult``).

Rules:

1. A :class:`ConnectionResult` is created when a connection arrives, before anything can fail, and used as a
   context manager around everything that happens to it. Leaving the block records it — counter and one
   ``egress`` event — on every path: a return, an exception, a cancellation. Nothing else counts or logs a
   decision, so no exit can forget to, and none can do it twice.
2. The code deciding sets the outcome once: :meth:`allow` (admitted: the event is written when it closes,
   with what :meth:`closed` adds — bytes, who closed it, duration), :meth:`deny` (the policy or the vetting
   refused what the agent asked for) or :meth:`fail` (allowed, but we could not get there). The counter moves
   when the outcome is set, so ``status`` counts a long-lived connection while it is open.
3. A connection that ends with no outcome set (an exception or cancellation before the decision) is recorded
   as ``error`` with reason ``internal-error``/``cancelled``; an admitted one that ends that way keeps
   ``allow`` and says how it ended in ``closed_by``.
"""

from __future__ import annotations

from types import TracebackType

import trio

from supervisor.jsonlog import JsonLog
from supervisor.protocol.egress import EgressRequest
from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.outcome_reasons import OutcomeReason

__all__ = ["ConnectionResult"]


class ConnectionResult:
    # one per live connection, held for its whole life: no per-instance __dict__
    __slots__ = ("_counters", "_fields", "_log", "_relaxed", "_started", "decision", "recorded", "request")

    def __init__(
        self, log: JsonLog, counters: dict[str, int], request: EgressRequest | None, *, relaxed: bool = False
    ) -> None:
        self._log = log
        self._counters = counters
        self.request = request
        self._relaxed = relaxed
        self._started = trio.current_time()
        self._fields: dict[str, JsonValue] = {}
        self.decision: str | None = None  # "allow", "deny" or "error" once set
        self.recorded = False

    # -- what the exits say ---------------------------------------------------------------------------------------
    def context(self, **fields: JsonValue) -> None:
        """Fields every outcome's event carries (policy generation, rule, endpoint…)."""
        self._fields.update(fields)

    def allow(self, **fields: JsonValue) -> None:
        self._decide("allow", "allowed", fields)

    def deny(self, reason: str, **fields: JsonValue) -> None:
        self._decide("deny", "denied", {"reason": reason, **fields})

    def fail(self, reason: str, **fields: JsonValue) -> None:
        self._decide("error", "failed", {"reason": reason, **fields})

    def closed(self, **fields: JsonValue) -> None:
        """How an admitted connection ended (bytes, ``closed_by``, ``error``…)."""
        self._fields.update(fields)

    def _decide(self, decision: str, counter: str, fields: dict[str, JsonValue]) -> None:
        if self.decision is not None:
            raise RuntimeError(f"egress outcome set twice ({self.decision}, then {decision})")
        self.decision = decision
        self._counters[counter] += 1
        self._fields.update(fields)

    # -- recording ------------------------------------------------------------------------------------------------
    def __enter__(self) -> ConnectionResult:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.record(exc)

    def record(self, exc: BaseException | None = None) -> None:
        """Count (if no outcome was set) and write the one event; later calls do nothing."""
        if self.recorded:
            return
        self.recorded = True
        ended = None if exc is None else ("cancelled" if _cancellation(exc) else OutcomeReason.INTERNAL_ERROR)
        if self.decision is None:
            self._decide("error", "failed", {"reason": ended or OutcomeReason.INTERNAL_ERROR})
            if exc is not None and ended == OutcomeReason.INTERNAL_ERROR:
                self._fields["detail"] = f"{type(exc).__name__}: {exc}"[:500]
        elif self.decision == "allow":
            if ended is not None and "closed_by" not in self._fields:
                self._fields["closed_by"] = ended
            self._fields["duration_ms"] = round((trio.current_time() - self._started) * 1000, 3)
        self._emit()

    def _emit(self) -> None:
        request = self.request
        if request is None:  # the request could not be read: nothing about it to say
            self._log.emit(EventName.EGRESS, decision=self.decision, **self._fields)
            return
        identity = request.identity
        self._log.emit(
            EventName.EGRESS,
            decision=self.decision,
            destination=request.authority,
            capture=str(request.capture),
            binary=identity.binary_path if identity else None,
            binary_sha256=identity.binary_sha256 if identity else None,
            ancestors=list(identity.ancestors) if identity else None,
            cmdline_paths=list(identity.cmdline_paths) or None if identity else None,  # absolute argv entries only
            loader_env=list(identity.loader_env) or None if identity else None,  # names only, never values
            pid=identity.pid if identity else None,  # with start_time: which process instance, not only which binary
            start_time=identity.start_time if identity else None,
            conn_id=request.conn_id,
            **({"identity": "relaxed"} if self._relaxed else {}),
            **self._fields,
        )


def _cancellation(exc: BaseException) -> bool:
    """A cancellation, alone or as every leaf of an exception group (a nursery's)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        return rest is None
    return isinstance(exc, trio.Cancelled)
