"""The fence's entries (capture/fence_dump.py) write the JSON objects ``setup.inspect`` fingerprints, key for key
and in order, and ``problems`` names every deviation from "only ``lo``"; the boundary's readers of the capture
calls' answers (capture/readback.py) take what they read with the defaults they always had."""

from __future__ import annotations

import json
import socket
from typing import Any

from supervisor.boundary.capture.fence_dump import Address, Link, Route, Rule, problems
from supervisor.boundary.capture.readback import FenceReadback, NetnsProbe


class _Msg(dict[str, Any]):
    """A pyroute2 message as the readers use it: ``get``, ``[]`` and ``get_nested``."""

    def __init__(self, kind: str | None = None, **fields: Any) -> None:
        super().__init__(fields)
        self.kind = kind

    def get_nested(self, *path: str) -> str | None:
        return self.kind


LO = Link.read(_Msg(None, index=1, ifname="lo", flags=1))
ANYIP4 = Route.read(
    _Msg(family=socket.AF_INET, table=255, type=2, dst="0.0.0.0", dst_len=0, oif=1, scope=254, proto=4),
    {1: "lo"},
)


def test_each_entry_writes_the_object_inspect_always_wrote() -> None:
    assert json.dumps(LO.to_wire()) == '{"index": 1, "name": "lo", "kind": null, "up": true}'
    address = Address.read(_Msg(family=socket.AF_INET, address="127.0.0.1", prefixlen=8, index=1), {1: "lo"})
    assert json.dumps(address.to_wire()) == '{"family": 2, "address": "127.0.0.1/8", "link": "lo"}'
    assert json.dumps(ANYIP4.to_wire()) == (
        '{"family": 2, "table": 255, "type": "local", "dst": "0.0.0.0/0", "oif": "lo", "gateway": null, '
        '"multipath": false, "scope": 254, "proto": 4, "priority": null}'
    )
    rule = Rule.read(_Msg(family=socket.AF_INET, priority=32766, table=254, action=1, src_len=0, dst_len=0))
    assert json.dumps(rule.to_wire()) == (
        '{"family": 2, "priority": 32766, "table": 254, "action": 1, "src": null, "dst": null, "iif": null, '
        '"oif": null, "fwmark": null}'
    )
    assert rule.is_default()


def test_problems_name_every_deviation() -> None:
    veth = Link.read(_Msg("veth", index=2, ifname="veth0", flags=1))
    via = Route.read(
        _Msg(family=socket.AF_INET, table=254, type=1, dst="10.0.0.0", dst_len=8, oif=2, scope=0, proto=3),
        {1: "lo", 2: "veth0"},
    )
    added = Rule.read(_Msg(family=socket.AF_INET, priority=100, table=5, action=1, src="10.0.0.0", src_len=8))
    v6 = Address.read(_Msg(family=socket.AF_INET6, address="::1", prefixlen=128, index=1), {1: "lo"})
    found = problems([LO, veth], [v6], [ANYIP4, via], [added], expect_anyip=True)
    assert found == [
        "unexpected link veth0 (veth)",
        "route via veth0: unicast 10.0.0.0/8 table 254",
        f"unexpected rule: {added.to_wire()}",
        "any-IP route local ::/0 is missing",
    ]
    assert problems([LO], [], [ANYIP4], [], expect_anyip=True) == []


def test_the_readers_take_the_fields_with_their_defaults() -> None:
    assert FenceReadback.from_wire({}) == FenceReadback(None, False, (), None)
    read = FenceReadback.from_wire({"fingerprint": "ab", "ok": True, "problems": ["x"], "links": [{"name": "lo"}]})
    assert read == FenceReadback("ab", True, ("x",), [{"name": "lo"}])
    assert read.triggered_by("timer").trigger == "timer"
    assert NetnsProbe.from_wire({"ok": True, "captured": True, "error": None}) == NetnsProbe(True, True, None)
    assert NetnsProbe.from_wire({}) == NetnsProbe(False, False, None)
