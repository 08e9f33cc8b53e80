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


def call(name: str, args: Mapping[str, Any], proc_net: str = "/proc/self/net") -> Any:
    """Call the allowed ``capture.setup`` function ``name`` in this process (which lives in the agent's netns) and
    return its result; a probe reads the namespace's TCP tables from ``proc_net``, whatever ``args`` say."""
    fn = _FUNCTIONS.get(name)
    if fn is None:
        raise OSError(errno.EPERM, f"capture call {name!r} is not allowed")
    kwargs = dict(args)
    if fn is capture_setup.probe:
        kwargs["proc_net"] = proc_net
    return fn(**kwargs)


def prepare(capture: Mapping[str, Any]) -> tuple[list[str], dict[str, Any], list[int]]:
    """``capture.setup.prepare(**capture)`` here: the listeners' names, the report, and the listener fds in the
    names' order."""
    got, report = capture_setup.prepare(**dict(capture))
    names = list(got)
    return names, report, [int(got[n]) for n in names]
