"""The registry of fuzz targets: name → (module, packages atheris instruments for coverage).

The registry names modules without importing them, so that the worker imports each target, and the parsers it
reaches, inside ``atheris.instrument_imports``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple


class Target(NamedTuple):
    module: str
    instrument: tuple[str, ...]


TARGETS: dict[str, Target] = {
    "proxy_head": Target("fuzz.targets.proxy_head", ("supervisor", "h11")),
    "l7_request": Target("fuzz.targets.l7_request", ("supervisor", "h11")),
    "client_hello": Target("fuzz.targets.client_hello", ("supervisor",)),
    "channel": Target("fuzz.targets.channel", ("supervisor",)),
    "policy": Target("fuzz.targets.policy", ("supervisor", "yaml")),
    "dns": Target("fuzz.targets.dns", ("supervisor", "dns")),
    "claims": Target("fuzz.targets.claims", ("supervisor",)),
    "zygote": Target("fuzz.targets.zygote", ("supervisor",)),
    "l7_body": Target("fuzz.targets.l7_body", ("supervisor", "graphql")),
}


def one_input(name: str) -> Callable[[bytes], None]:
    """The target's entry point (imports its module)."""
    module = importlib.import_module(TARGETS[name].module)
    entry: Callable[[bytes], None] = module.one_input
    return entry
