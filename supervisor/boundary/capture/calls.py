"""The capture work the zygote does for the boundary in the agent's network namespace (``capture.setup``).

Its own module so that the workload's init, which imports ``zygote`` and nothing of the boundary's, does not
import ``capture.setup`` either: that pulls in ``subprocess`` and with it ``threading``, whose at-fork handler
would then run in every process the init forks (an exec-init and its command, per exec) — about 1 ms of CPU
and 180 copied pages per exec. The launcher imports this module and hands it to the zygote it forks
(``zygote.main``), so the zygote never imports it lazily from inside the agent's namespaces.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from typing import Any, Final

from supervisor.boundary.capture import setup as capture_setup

# the capture functions the boundary may call in the agent's namespace, by the name it sends
_FUNCTIONS: Final[Mapping[str, Callable[..., dict[str, Any]]]] = {
    "inspect": capture_setup.inspect,
    "probe": capture_setup.probe,
}
CAPTURE_CALLS: Final = frozenset(_FUNCTIONS)


def call(request: Mapping[str, Any], proc_net: str = "/proc/self/net") -> dict[str, Any]:
    """Call an allowed ``capture.setup`` function in this process (which lives in the agent's netns); a probe
    reads the namespace's TCP tables from ``proc_net``, whatever the request says."""
    fn = _FUNCTIONS.get(str(request.get("fn")))
    if fn is None:
        raise OSError(errno.EPERM, f"capture call {request.get('fn')!r} is not allowed")
    args = dict(request.get("args") or {})
    if fn is capture_setup.probe:
        args["proc_net"] = proc_net
    result = fn(**args)
    return {"id": request.get("id"), "ok": True, "result": result}


def prepare(request: Mapping[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """``capture.setup.prepare(**capture)`` here: the reply (names, report) and the listener fds, in order."""
    got, report = capture_setup.prepare(**dict(request["capture"]))
    names = list(got)
    return {"id": request.get("id"), "ok": True, "fd_names": names, "report": report}, [int(got[n]) for n in names]
