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
from typing import Final

from supervisor.boundary.capture import setup as capture_setup
from supervisor.protocol.json_value import JsonValue

# the capture functions the boundary may call in the agent's namespace, by the name it sends
_FUNCTIONS: Final[Mapping[str, Callable[..., dict[str, JsonValue]]]] = {
    "inspect": capture_setup.inspect,
    "probe": capture_setup.probe,
}
CAPTURE_CALLS: Final = frozenset(_FUNCTIONS)
_PREPARE_ARGS: Final = frozenset({"capture_ports", "proxy_port"})


def call(name: str, args: Mapping[str, JsonValue], proc_net: str = "/proc/self/net") -> dict[str, JsonValue]:
    """Call the allowed ``capture.setup`` function ``name`` in this process (which lives in the agent's netns) and
    return its result; a probe reads the namespace's TCP tables from ``proc_net``, whatever ``args`` say."""
    fn = _FUNCTIONS.get(name)
    if fn is None:
        raise OSError(errno.EPERM, f"capture call {name!r} is not allowed")
    kwargs = dict(args)
    if fn is capture_setup.probe:
        kwargs["proc_net"] = proc_net
    return fn(**kwargs)


def prepare(capture: Mapping[str, JsonValue]) -> tuple[list[str], dict[str, JsonValue], list[int]]:
    """``capture.setup.prepare(**capture)`` here: the listeners' names, the report, and the listener fds in the
    names' order. ``capture`` holds ``capture_ports`` and, optionally, ``proxy_port``; the ports are checked
    by ``capture.setup``."""
    unknown = set(capture) - _PREPARE_ARGS
    if unknown:
        raise TypeError(f"capture setup takes no {sorted(unknown)}")
    if "capture_ports" not in capture:
        raise TypeError("capture setup needs capture_ports")
    raw_ports = capture["capture_ports"]
    if not isinstance(raw_ports, list):
        raise TypeError("capture_ports must be a list")
    ports = [_port(p) for p in raw_ports]
    if "proxy_port" in capture:
        got, report = capture_setup.prepare(capture_ports=ports, proxy_port=_port(capture["proxy_port"]))
    else:
        got, report = capture_setup.prepare(capture_ports=ports)
    names = list(got)
    return names, report, [int(got[n]) for n in names]


def _port(value: JsonValue) -> int:
    """An int, as ``capture.setup`` checks it further (a bool is not a port)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"invalid port {value!r}")
    return value
