"""Every event renders as OCSF 1.7.0 (docs/design.md "Events", docs/reference/policy.md §4.1).

Each name of the catalogue has its mapping; a rendering of each, and of every decision shape, validates against
the OCSF 1.7.0 schema vendored in tests/ocsf/ (the ``ocsf/ocsf-schema`` repository at tag 1.7.0, compiled with
``ocsf-schema-compiler``); ``actor.process.cmd_line`` is the resolved binary only, bounded, placeholders hidden.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema
import pytest

from supervisor.protocol import ocsf
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.ocsf import MAX_CMD_LINE, OCSF_MAP, OcsfClass, ocsf_lines, shorthand
from tests.ocsf.json_schema import class_schema, compiled

SANDBOX = "s-7f3a"
DECISION = {"destination": "blocked.com:443", "binary": "/usr/bin/python3", "pid": 42, "start_time": 991,
            "binary_sha256": "ab" * 32, "ancestors": ["/usr/bin/bash", "/usr/bin/node"], "conn_id": "c1",
            "capture": "transparent", "policy_generation": 3}  # fmt: skip
HTTP = {**DECISION, "destination": "api.github.com:443", "tls": True, "method": "GET", "path": "/repos/x",
        "rule": "github", "endpoint": "api.github.com:443", "status": 200, "bytes_up": 0, "bytes_down": 512,
        "duration_ms": 12.5, "injected": 1}  # fmt: skip

# Every decision shape the daemons write, beyond the one generic sample per name.
SHAPES: list[tuple[EventName, dict[str, Any]]] = [
    (
        EventName.EGRESS,
        {
            **DECISION,
            "decision": "allow",
            "rule": "pypi",
            "bytes_out": 10,
            "bytes_in": 20,
            "closed_by": "agent",
            "duration_ms": 4.2,
        },
    ),
    (EventName.EGRESS, {**DECISION, "decision": "deny", "reason": "no-matching-endpoint"}),
    (EventName.EGRESS, {**DECISION, "destination": "10.0.0.1:80", "decision": "deny", "reason": "internal-address"}),
    (EventName.EGRESS, {**DECISION, "decision": "error", "reason": "connect-refused"}),
    (EventName.EGRESS, {"decision": "deny", "reason": "malformed-request", "detail": "bad header"}),
    (EventName.EGRESS_REFUSED, {"destination": "[2001:db8::1]:443", "reason": "identity-unresolved: no-record"}),
    (EventName.HTTP, {**HTTP, "decision": "allow"}),
    (EventName.HTTP, {**HTTP, "decision": "deny", "method": "POST", "reason": "l7-denied", "status": 403}),
    (
        EventName.HTTP,
        {
            **HTTP,
            "decision": "deny",
            "reason": "request_authority_mismatch",
            "status": 421,
            "finding": "openshell.http.request_authority_mismatch",
            "request_authority": "evil.test:443",
        },
    ),
    (
        EventName.HTTP,
        {
            **HTTP,
            "decision": "deny",
            "reason": "credential_endpoint_mismatch",
            "status": 403,
            "finding": "openshell.http.credential_endpoint_mismatch",
        },
    ),
    (EventName.HTTP, {**HTTP, "decision": "audit", "method": "WEBSOCKET_TEXT"}),
    (EventName.HTTP_TUNNEL, {**DECISION, "stage": "refused", "reason": "unsupported_l7_protocol"}),
    (EventName.DNS, {"name": "pypi.org", "qtype": "A", "decision": "answered", "addresses": ["192.0.2.7"]}),
    (EventName.DNS, {"name": "exfil.evil.test", "qtype": "TXT", "decision": "refused", "reason": "no-endpoint"}),
    (EventName.DNS, {"name": "pypi.org", "decision": "failed", "reason": "resolve-timeout"}),
    (EventName.LINK_REFUSED, {"peer": "10.1.2.3", "field": "sandbox_uid", "reason": "claims differ"}),
    (EventName.POLICY_GENERATION, {"generation": 4, "status": "quarantined", "source": "/etc/policy.yaml"}),
    (EventName.PROCESS_STARTED, {"handle": "p_1", "kind": "exec", "pid": 77}),
    (EventName.AGENT_EXITED, {"handle": "p_0", "result": {"code": 0, "reason": "exited"}}),
    (EventName.ENFORCEMENT_LOST, {"reason": "a route appeared", "agent_result": {"signal": 9}}),
]


@cache
def _validator(uid: int, profiles: frozenset[str]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(class_schema(uid, profiles))


def _objects(event: Event) -> list[dict[str, Any]]:
    lines = ocsf_lines(event)
    assert lines.endswith("\n")
    parsed = [json.loads(line) for line in lines.splitlines()]
    assert parsed == ocsf._objects(event)  # the line's fixed parts, written once per kind, say the same
    return parsed


def _check(obj: dict[str, Any]) -> None:
    errors = [
        f"{e.json_path}: {e.validator} {str(e.validator_value)[:200]}"
        for e in _validator(obj["class_uid"], frozenset(obj["metadata"]["profiles"])).iter_errors(obj)
    ]
    assert not errors, json.dumps(obj)[:2000] + "\n" + "\n".join(errors)
    assert obj["type_uid"] == obj["class_uid"] * 100 + obj["activity_id"]
    assert obj["metadata"]["version"] == compiled()["version"] == "1.7.0"


def test_every_event_name_has_its_mapping() -> None:
    missing = sorted(set(EventName) - set(OCSF_MAP))
    assert not missing, f"event names without an OCSF mapping in supervisor/protocol/ocsf.py: {missing}"


@pytest.mark.parametrize("name", list(EventName))
def test_each_mapping_renders_valid_ocsf(name: EventName) -> None:
    event = Event.build(name, "control", SANDBOX, reason="why", detail="more", generation=2)
    objects = _objects(event)
    assert objects[0]["class_uid"] == OCSF_MAP[name].activity.ocsf_class
    for obj in objects:
        _check(obj)
        assert obj["unmapped"]["sandbox"] == SANDBOX and obj["metadata"]["event_code"] == name


@pytest.mark.parametrize(("name", "fields"), SHAPES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SHAPES)])
def test_each_decision_shape_renders_valid_ocsf(name: EventName, fields: dict[str, Any]) -> None:
    for obj in _objects(Event.build(name, "control", SANDBOX, **fields)):
        _check(obj)


def test_classes_activities_and_outcomes_follow_the_table() -> None:
    def first(name: EventName, **fields: Any) -> dict[str, Any]:
        return _objects(Event.build(name, "control", SANDBOX, **fields))[0]

    denied = first(EventName.EGRESS, **DECISION, decision="deny", reason="no-matching-endpoint")
    assert (denied["class_uid"], denied["activity_id"], denied["action_id"], denied["disposition_id"]) == (
        4001,
        1,
        2,
        2,
    )
    assert denied["severity_id"] == 3 and denied["firewall_rule"] == {"name": "-", "type": "l4"}
    assert denied["dst_endpoint"] == {"hostname": "blocked.com", "port": 443}
    assert denied["status_detail"] == "no-matching-endpoint"
    ssrf = first(
        EventName.EGRESS, **{**DECISION, "destination": "10.0.0.1:80"}, decision="deny", reason="internal-address"
    )
    assert ssrf["firewall_rule"]["type"] == "ssrf" and ssrf["dst_endpoint"] == {"ip": "10.0.0.1", "port": 80}
    allowed = first(EventName.EGRESS, **DECISION, decision="allow", rule="pypi", bytes_out=10, bytes_in=20)
    assert (allowed["action_id"], allowed["severity_id"], allowed["firewall_rule"]["name"]) == (1, 1, "pypi")
    assert allowed["traffic"] == {"bytes_out": 10, "bytes_in": 20}
    http = first(EventName.HTTP, **HTTP, decision="allow")
    assert http["class_uid"] == 4002 and http["http_request"] == {
        "http_method": "GET",
        "url": {"scheme": "https", "path": "/repos/x", "hostname": "api.github.com", "port": 443},
    }
    assert http["http_response"] == {"code": 200} and http["unmapped"]["injected"] == 1
    assert first(EventName.POLICY_GENERATION, generation=3)["class_uid"] == OcsfClass.CONFIG_STATE_CHANGE
    assert first(EventName.PROCESS_STARTED, handle="p_1")["class_uid"] == OcsfClass.PROCESS_ACTIVITY
    assert first(EventName.ENFORCEMENT_LOST, reason="x")["class_uid"] == OcsfClass.DETECTION_FINDING
    finding = "openshell.http.request_authority_mismatch"
    mismatch = _objects(Event.build(EventName.HTTP, "control", SANDBOX, **HTTP, decision="deny",
                                    reason="request_authority_mismatch", finding=finding))  # fmt: skip
    assert [o["class_uid"] for o in mismatch] == [4002, 2004]
    assert mismatch[0]["firewall_rule"]["type"] == "request-authority" and mismatch[0]["severity_id"] == 4
    assert mismatch[1]["finding_info"]["types"] == ["openshell.http.request_authority_mismatch"]


def test_cmd_line_is_the_resolved_binary_only_bounded_and_without_placeholders() -> None:
    """The agent names its binaries: a placeholder in the name is hidden, a long name is cut, the argv is never
    carried (the events have none, and the rendering adds none)."""
    long_dir = "/work/" + "d" * 2000
    binary = f"{long_dir}/openshell:resolve:env:API_TOKEN"
    fields = {**DECISION, "binary": binary, "decision": "deny", "ancestors": ["/work/OPENSHELL-RESOLVE-ENV-API_TOKEN"]}
    event = Event.build(EventName.EGRESS, "control", SANDBOX, **fields)
    [obj] = _objects(event)
    process = obj["actor"]["process"]
    assert len(process["cmd_line"]) <= MAX_CMD_LINE and process["cmd_line"].startswith("/work/ddd")
    line = ocsf_lines(event) + shorthand(event)
    assert "API_TOKEN" not in line and "resolve:env" not in line
    _check(obj)
    argv = Event.build(EventName.EGRESS, "control", SANDBOX, **DECISION,
                       cmdline_paths=["/work/in.txt", "-o", "/work/openshell:resolve:env:X"])  # fmt: skip
    assert _objects(argv)[0]["actor"]["process"]["cmd_line"] == "/usr/bin/python3 /work/in.txt /work/[CREDENTIAL]"
    relative = _objects(Event.build(EventName.EGRESS, "control", SANDBOX, **{**DECISION, "binary": "curl"}))[0]
    assert "cmd_line" not in relative["actor"]["process"]  # only an absolute path control resolved


def test_a_json_line_read_back_renders_the_same() -> None:
    """``logs --format ocsf`` renders from control's JSON lines: the same objects as the daemon's own rendering."""
    event = Event.build(EventName.HTTP, "control", SANDBOX, **{**HTTP, "decision": "allow"})
    again = Event.from_wire(json.loads(event.json_line()))
    assert again == event and ocsf_lines(again) == ocsf_lines(event)


def test_the_shorthand() -> None:
    event = Event.build(
        EventName.EGRESS, "control", SANDBOX, **{**DECISION, "decision": "deny", "reason": "no-matching-endpoint"}
    )
    assert shorthand(event) == "NET:OPEN [MED] DENIED python3(42) -> blocked.com:443 [reason:no-matching-endpoint]"
    http = Event.build(EventName.HTTP, "control", SANDBOX, **{**HTTP, "decision": "allow"})
    assert shorthand(http) == "HTTP:OTHER [INFO] ALLOWED python3(42) -> GET api.github.com:443/repos/x [rule:github]"
    policy = Event.build(EventName.POLICY_GENERATION, "control", SANDBOX, generation=3, status="loaded")
    assert shorthand(policy) == "CONFIG:LOG [INFO] policy.generation generation=3 status=loaded"


def test_build_normalises_values_and_keeps_the_common_keys() -> None:
    from pathlib import Path

    fields = {"path": Path("/run/x"), "pair": (1, "a"), "none": None, "event": "forged", "time": "0"}
    event = Event.build(EventName.API_LISTENING, "control", SANDBOX, **fields)
    assert event.fields == {"path": "/run/x", "pair": [1, "a"]} and event.name is EventName.API_LISTENING


def test_a_log_with_the_placeholders_hides_them_in_every_agent_chosen_field() -> None:
    """The boundary knows the agent's placeholders (custom spellings too) from attach; control knows them from its
    credentials. A binary, a path or a reason spelling one is written with ``[CREDENTIAL]`` in both formats."""
    import io

    from supervisor.jsonlog import JsonLog, LogFormat
    from supervisor.protocol.ocsf import placeholder_scrub

    custom = "my-custom-token-placeholder-01"
    for form in LogFormat:
        stream = io.StringIO()
        log = JsonLog("boundary", stream=stream, sandbox=SANDBOX, log_format=form)
        log.scrub = placeholder_scrub(["openshell:resolve:env:API_TOKEN", custom])
        log.emit(EventName.EGRESS_REFUSED, reason="no-egress-link", destination=f"{custom}.test:443",
                 binary=f"/work/{custom}", detail="openshell:resolve:env:API_TOKEN")  # fmt: skip
        text = stream.getvalue()
        assert custom not in text and "resolve:env" not in text and "API_TOKEN" not in text, text
        assert "/work/[CREDENTIAL]" in text


def test_a_list_of_agent_text_is_scrubbed_item_by_item_and_other_fields_are_left_alone() -> None:
    import io

    from supervisor.jsonlog import JsonLog
    from supervisor.protocol.ocsf import placeholder_scrub

    stream = io.StringIO()
    log = JsonLog("boundary", stream=stream, sandbox=SANDBOX)
    log.scrub = placeholder_scrub(["secret-placeholder-0001"])
    log.emit(EventName.EGRESS_REFUSED, ancestors=("/bin/secret-placeholder-0001", 7), method="secret-placeholder-0001")
    line = json.loads(stream.getvalue())
    assert line["ancestors"] == ["/bin/[CREDENTIAL]", 7] and line["method"] == "secret-placeholder-0001"


def test_what_no_attribute_holds_stays_in_unmapped() -> None:
    """Nothing the JSON line says is lost: a field the class places nowhere is in ``unmapped``."""
    policy = _objects(Event.build(EventName.POLICY_GENERATION, "control", SANDBOX, generation=4, status="quarantined"))
    assert policy[0]["unmapped"]["status"] == "quarantined" and policy[0]["unmapped"]["generation"] == 4
    api = _objects(Event.build(EventName.API_LISTENING, "control", SANDBOX, path="/run/openshell-sandbox/s/api.sock"))
    assert api[0]["unmapped"]["path"] == "/run/openshell-sandbox/s/api.sock"
    odd = _objects(
        Event.build(EventName.HTTP, "control", SANDBOX, **{**HTTP, "decision": "deny", "method": "PROPFIND"})
    )
    assert "http_method" not in odd[0]["http_request"] and odd[0]["unmapped"]["method"] == "PROPFIND"
    _check(odd[0])
