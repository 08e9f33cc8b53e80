"""The JSON control writes, byte for byte: the denials ``GET /v1/denials`` serves, the activity counters of
``GET /v1/activity`` and ``status``, the boundary's status as ``status`` repeats it, and what a malformed
``/v1/denials`` entry raises (``policy suggest`` names it)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from supervisor.control.daemon import ControlDaemon
from supervisor.control.denials import DenialEntry, DenialTable
from supervisor.protocol.activity import ActivityCounters, DenyGroup
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.lifecycle import State
from supervisor.protocol.status import StatusReply


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def test_denials_keep_their_keys_order_and_omissions() -> None:
    table = DenialTable()
    table.observe(Event.build(EventName.EGRESS, "control", "dev-1", decision="deny", destination="a.test:443",
                              capture="connect", binary="/usr/bin/curl", ancestors=["/bin/sh"],
                              reason="no-matching-endpoint", loader_env=["LD_PRELOAD"]))  # fmt: skip
    table.observe(Event.build(EventName.HTTP, "control", "dev-1", decision="deny", destination="b.test:443",
                              binary="/usr/bin/node", reason="l7-no-allow-rule", rule="api", endpoint="api[0]",
                              method="POST", path="/", operation="tools/call x"))  # fmt: skip
    body = table.to_json()
    first, second = body["denials"]
    assert list(first) == ["host", "port", "binary", "ancestors", "denial_stage", "deny_reason", "count",
                           "first_seen_ms", "last_seen_ms", "l7_samples", "loader_env"]  # fmt: skip
    assert list(second) == ["host", "port", "binary", "ancestors", "denial_stage", "deny_reason", "count",
                            "first_seen_ms", "last_seen_ms", "l7_samples", "rule", "endpoint"]  # fmt: skip
    assert _compact(second["l7_samples"]) == '[{"method":"POST","path":"/","count":1,"operation":"tools/call x"}]'
    assert list(body) == ["denials", "evicted"]


def test_entry_list_fields_are_copies() -> None:
    """The document never shares a list with the live entry: a later denial does not change what was served."""
    table = DenialTable()
    table.observe(Event.build(EventName.EGRESS, "control", "dev-1", decision="deny", destination="a.test:443",
                              binary="/usr/bin/curl", ancestors=["/bin/sh"],
                              reason="no-matching-endpoint"))  # fmt: skip
    entry = table.entries()[0]
    served = entry.to_json()
    assert served["ancestors"] == entry.ancestors and served["ancestors"] is not entry.ancestors


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"port": None}, TypeError),
        ({"port": "x"}, ValueError),
        ({"ancestors": "/bin/sh"}, TypeError),
        ({"l7_samples": ["GET /"]}, TypeError),
        ({"count": [1]}, TypeError),
    ],
)
def test_a_malformed_entry_raises_what_policy_suggest_reports(change: dict[str, object], error: type) -> None:
    raw = {"host": "a.test", "port": 443, "binary": None, "ancestors": [], "denial_stage": "connect",
           "deny_reason": "no-matching-endpoint", "count": 1, "first_seen_ms": 1, "last_seen_ms": 2,
           "l7_samples": [], **change}  # fmt: skip
    with pytest.raises(error):
        DenialEntry.from_json(json.loads(json.dumps(raw)))


def test_a_missing_entry_field_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        DenialEntry.from_json({"host": "a.test"})


def test_activity_is_the_counters_document() -> None:
    counters = ActivityCounters()
    counters.count(None)
    counters.count(DenyGroup.SSRF)
    daemon = SimpleNamespace(metrics=SimpleNamespace(activity=counters))
    assert _compact(ControlDaemon.activity(daemon)) == _compact(counters.to_json())


def test_the_boundary_status_is_repeated_as_written() -> None:
    reply = StatusReply(State.RUNNING, "b-1", "U", processes=({"pid": 7, "argv": ["sh"]},), links=2,
                        limits={"memory": {"max": None}})  # fmt: skip
    daemon = SimpleNamespace(peer=SimpleNamespace(reported=reply))
    repeated = ControlDaemon._reported(daemon)
    assert json.dumps(repeated) == json.dumps(reply.to_wire())
    assert ControlDaemon._reported(SimpleNamespace(peer=SimpleNamespace(reported=None))) == {}
