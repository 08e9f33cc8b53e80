"""How long control has been without its workload, and what to tell the operator once that is too long.

In a cluster the workload pod ends with its agent (``restartPolicy: Never``) while control's Deployment stays,
redialling; nothing removes the sandbox's objects unless an owner does. Past ``--workload-gone-after`` without
an ops link (since control started, or since the last link went down), ``readyz`` names the time and ``status``
the commands that remove the sandbox (by its id label, pods first: supervisor/k8s/names.py).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field

from supervisor.k8s.names import delete_commands
from supervisor.protocol.json_value import JsonValue

__all__ = ["DEFAULT_GONE_AFTER_S", "WorkloadGone"]

DEFAULT_GONE_AFTER_S = 600.0


def _iso(when: datetime.datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class WorkloadGone:
    after_s: float
    namespace: str
    sandbox_uid: str
    # since when no link is up: (monotonic, wall clock); None while one is
    _since: tuple[float, datetime.datetime] | None = field(
        default_factory=lambda: (time.monotonic(), datetime.datetime.now(datetime.UTC))
    )

    def seen(self) -> None:
        """An ops link to the boundary is up."""
        self._since = None

    def lost(self) -> None:
        """The ops link is down (kept from the first loss: redials do not restart the clock)."""
        if self._since is None:
            self._since = (time.monotonic(), datetime.datetime.now(datetime.UTC))

    def gone(self, now: float | None = None) -> tuple[datetime.datetime, float] | None:
        """(since, seconds) once past ``after_s`` without a link; None otherwise."""
        if self._since is None:
            return None
        seconds = (time.monotonic() if now is None else now) - self._since[0]
        return (self._since[1], seconds) if seconds >= self.after_s else None

    def readiness(self, now: float | None = None) -> str | None:
        found = self.gone(now)
        if found is None:
            return None
        since, seconds = found
        return (
            f"workload: gone since {_iso(since)} ({int(seconds // 60)} min without a link): the sandbox has ended; "
            "`openshell-sandbox status` says what to delete"
        )

    def status(self, now: float | None = None) -> dict[str, JsonValue] | None:
        found = self.gone(now)
        if found is None:
            return None
        since, seconds = found
        return {
            "since": _iso(since),
            "seconds": int(seconds),
            "delete": list(delete_commands(self.namespace, self.sandbox_uid)),
        }
