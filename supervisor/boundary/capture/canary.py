"""The boundary's half of model P's canary (protocol/fence_canary.py): one TCP connect to control's canary from
the pod's network namespace, which must fail.

Rules:

1. The target is only ever the descriptor's ``fence_canary`` (control's flags), a literal IP: nothing is
   resolved, nothing is sent after a connect (a connect that succeeds is closed at once — it is the finding).
2. Refused, unreachable, not permitted and a timeout of ``PROBE_TIMEOUT_S`` are how a fence makes a connect
   fail: they count as "failed" (the fence held); only an established connection counts as "connected". Any other
   failure is local and says nothing about the fence — above all ``EADDRNOTAVAIL``: the agent shares the pod's
   namespace and can hold every ephemeral port with ``bind()`` alone, so the probe cannot pick a source port
   while the agent dials out from the ports it holds. Such a probe is *inconclusive* (``conclusive=False``), and
   the daemon treats it as no fence observed.
3. The probe runs in the boundary itself: in proxy-env it shares the pod's namespace and the pod's NetworkPolicy
   with the agent, and no workload process is involved.
"""

from __future__ import annotations

import errno
import socket
from typing import Final

import trio

from supervisor.protocol.fence_canary import PROBE_TIMEOUT_S, ProbeResult

__all__ = ["FENCE_ERRNOS", "ProbeResult", "probe_canary"]

# How a connect fails when a fence stops it (rule 2): a REJECT's RST or ICMP, a local netfilter drop (EPERM/EACCES)
# and routing. Everything else (EADDRNOTAVAIL, ENOBUFS, EMFILE, ...) is inconclusive.
FENCE_ERRNOS: Final = frozenset(
    {errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.EPERM,
     errno.EACCES}
)  # fmt: skip


async def probe_canary(probe: int, address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    target = f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"
    try:
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        return ProbeResult(probe, target, False, f"no socket: {exc.strerror}", conclusive=False)
    try:
        with trio.move_on_after(timeout_s):
            try:
                await sock.connect((address, port))
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                return ProbeResult(probe, target, False, f"{name}: {exc.strerror}", exc.errno in FENCE_ERRNOS)
            return ProbeResult(probe, target, True, "")
        return ProbeResult(probe, target, False, f"timeout after {timeout_s:g}s")
    finally:
        sock.close()
