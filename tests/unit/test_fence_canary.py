"""Model P's canary, the shared half (supervisor/protocol/fence_canary.py) and the descriptor fields that carry it
(supervisor/protocol/attach.py): literal addresses only, strict reports, "observed" only when nothing was seen
and the self-check answered."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.protocol.attach import CONTRACT_VERSION, AttachRequest, CaptureMode, parse_attach
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.fence_canary import CanaryReport, format_canary, parse_canary
from tests.certs_fixtures import SAMPLE_CLAIMS


@pytest.mark.parametrize(
    ("text", "expected"),
    [("198.51.100.1:7444", ("198.51.100.1", 7444)), ("[2001:db8::1]:9", ("2001:db8::1", 9)),
     ("2001:db8::1:9", ("2001:db8::1", 9))],
)  # fmt: skip
def test_parse_canary(text: str, expected: tuple[str, int]) -> None:
    assert parse_canary(text) == expected
    assert parse_canary(format_canary(*expected)) == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [("control.example:7444", "literal IP"), ("198.51.100.1", "not ADDR:PORT"), ("198.51.100.1:0", "1..65535"),
     ("198.51.100.1:http", "1..65535"), ("0.0.0.0:7444", "cannot be connected"), (":7444", "not ADDR:PORT")],
)  # fmt: skip
def test_parse_canary_refuses_names_and_nonsense(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_canary(text)


def test_report_round_trip_and_observed() -> None:
    report = CanaryReport(probe=3, seen=0, self_check="ok")
    assert CanaryReport.from_wire(report.to_wire()) == report
    assert report.observed
    assert not CanaryReport(probe=3, seen=1, self_check="ok", peers=("198.51.100.2:40000",)).observed
    assert not CanaryReport(probe=3, seen=0, self_check="connect refused").observed


@pytest.mark.parametrize(
    ("body", "field"),
    [(None, "canary"), ({"probe": 1, "seen": 0}, "canary.self_check"), ({"probe": True, "seen": 0,
     "self_check": "ok"}, "canary.probe"), ({"probe": 1, "seen": -1, "self_check": "ok"}, "canary.seen"),
     ({"probe": 1, "seen": 0, "self_check": "ok", "extra": 1}, "canary.extra"),
     ({"probe": 1, "seen": 0, "self_check": "ok", "peers": [1]}, "canary.peers")],
)  # fmt: skip
def test_report_is_strict(body: Any, field: str) -> None:
    with pytest.raises(OpError) as info:
        CanaryReport.from_wire(body)
    assert info.value.kind is ErrorKind.INVALID and info.value.field == field


def _descriptor(**fields: Any) -> dict[str, Any]:
    return AttachRequest(
        sandbox=SAMPLE_CLAIMS.sandbox, network_policy=SAMPLE_CLAIMS.network_policy,
        capture_mode=CaptureMode.PROXY_ENV, acknowledge_external_fence=True, **fields,
    ).to_wire()  # fmt: skip


def test_descriptor_carries_the_canary_and_the_unprobed_acknowledgement() -> None:
    parsed = parse_attach(_descriptor(fence_canary="198.51.100.1:7444"), SAMPLE_CLAIMS)
    assert parsed.fence_canary == "198.51.100.1:7444" and not parsed.acknowledge_unprobed_fence
    parsed = parse_attach(_descriptor(acknowledge_unprobed_fence=True), SAMPLE_CLAIMS)
    assert parsed.fence_canary is None and parsed.acknowledge_unprobed_fence
    assert CONTRACT_VERSION == 2


def test_descriptor_refuses_a_canary_name_and_an_old_version() -> None:
    with pytest.raises(OpError) as info:
        parse_attach(_descriptor(fence_canary="control.example:7444"), SAMPLE_CLAIMS)
    assert info.value.kind is ErrorKind.INVALID and info.value.field == "fence_canary"
    with pytest.raises(OpError) as info:
        parse_attach({**_descriptor(), "version": 1}, SAMPLE_CLAIMS)
    assert info.value.field == "version"


def test_status_and_dev_say_how_the_fence_was_confirmed() -> None:
    from pathlib import Path

    from supervisor.cli.client_commands import _fence_line
    from supervisor.cli.dev_console import Console

    assert _fence_line(None) == "fence       not confirmed"
    unprobed = {"mode": "proxy-env", "privilege_model": "P", "probe": "acknowledged-unprobed"}
    assert _fence_line(unprobed) == "fence       proxy-env  probe acknowledged-unprobed"
    canary = {"mode": "proxy-env", "probe": "canary", "canary": "198.51.100.1:7444"}
    assert _fence_line(canary) == "fence       proxy-env  probe canary 198.51.100.1:7444"
    netns = {"mode": "netns", "privilege_model": "R", "probe": "captured"}
    for fence, note in (
        (unprobed, "fence proxy-env (acknowledged-unprobed), model P"),
        (netns, "fence netns, model R"),
    ):
        c = Console(sandbox="dev-1", policy=Path("/p.yaml"), policy_label="p.yaml", events_path=Path("/e.jsonl"))
        c.lines_for({"event": "lifecycle.ready", "component": "control", "fence": fence})
        [line] = c.lines_for({"event": "lifecycle.running", "component": "control"})
        assert note in line, line


@pytest.mark.parametrize("text", ["127.0.0.1:7444", "127.9.9.9:7444", "[::1]:7444", "[::ffff:127.0.0.1]:7444"])
def test_parse_canary_refuses_loopback(text: str) -> None:
    """A loopback canary is the pod's own loopback to the boundary (where the agent may listen, or nothing does:
    a refused connect that would pass for the fence while nothing crossed the pod's network) and control's own to
    its self-check: it observes no fence at all, so neither daemon takes one."""
    with pytest.raises(ValueError, match="loopback"):
        parse_canary(text)
    with pytest.raises(OpError) as info:
        parse_attach(_descriptor(fence_canary=text), SAMPLE_CLAIMS)  # the boundary refuses it too
    assert info.value.field == "fence_canary"
