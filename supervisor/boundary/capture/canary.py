"""The boundary's half of model P's canary (protocol/fence_canary.py): one TCP connect to control's canary from
the pod's network namespace, which must fail.

Rules:

1. The target is only ever the descriptor's ``fence_canary`` (control's flags), a literal IP: nothing is
   resolved, nothing is sent after a connect (a connect that succeeds is closed at once — it is the finding).
2. Refused, unreachable and a timeout of ``PROBE_TIMEOUT_S`` all count as "failed" (the fence held); only an
   established connection counts as "connected".
3. The probe runs in the boundary itself: in proxy-env it shares the pod's namespace and the pod's NetworkPolicy
   with the agent, and no workload process is involved.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import Any

import trio

from supervisor.protocol.fence_canary import PROBE_TIMEOUT_S

__all__ = ["ProbeResult", "probe_canary"]


@dataclass(frozen=True)
class ProbeResult:
    probe: int
    target: str
    connected: bool
    error: str  # why the connect failed ("" when it connected)

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "target": self.target, "connected": self.connected, "error": self.error}


async def probe_canary(probe: int, address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    target = f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        with trio.move_on_after(timeout_s):
            try:
                await sock.connect((address, port))
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                return ProbeResult(probe, target, False, f"{name}: {exc.strerror}")
            return ProbeResult(probe, target, True, "")
        return ProbeResult(probe, target, False, f"timeout after {timeout_s:g}s")
    finally:
        sock.close()
