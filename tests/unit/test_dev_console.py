"""Dev mode's human lines and ``logs``' one-liners, from events alone (no processes)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from supervisor.cli.dev_console import Console, EventsTail
from supervisor.cli.human import clean, summary

EVENTS = Path("/state/openshell-sandbox/dev-1/events.jsonl")


def console() -> Console:
    return Console(sandbox="dev-1", policy=Path("/p/agent policy.yaml"), policy_label="agent.yaml",
                   events_path=EVENTS)  # fmt: skip


def deny(**fields: Any) -> dict[str, Any]:
    base = {"event": "egress", "component": "control", "decision": "deny", "destination": "example.test:443",
            "binary": "/usr/bin/curl", "ancestors": ["/usr/bin/dash"], "reason": "no-matching-endpoint"}  # fmt: skip
    return {**base, **fields}


def test_the_ready_line_comes_once_with_what_a_person_needs() -> None:
    c = console()
    assert c.lines_for({"event": "lifecycle.bound", "component": "boundary", "policy_generation": 3}) == []
    assert c.lines_for({"event": "lifecycle.ready", "component": "control",
                        "fence": {"mode": "netns", "privilege_model": "U"}}) == []  # fmt: skip
    assert c.lines_for({"event": "lifecycle.running", "component": "boundary"}) == []
    [line] = c.lines_for({"event": "lifecycle.running", "component": "control"})
    for part in ("dev-1", "policy agent.yaml (generation 3)", "fence netns", "model U",
                 "openshell-sandbox exec -it -- sh", str(EVENTS)):  # fmt: skip
        assert part in line
    assert c.lines_for({"event": "lifecycle.running", "component": "control"}) == []  # a resumed control


def test_a_refusal_line_names_binary_destination_reason_and_the_command_that_explains_it() -> None:
    [line] = console().lines_for(deny())
    assert line.startswith(
        "openshell-sandbox: NET:OPEN [MED] DENIED curl -> example.test:443 [reason:no-matching-endpoint] (why: "
    )
    command = line.split("(why: ", 1)[1].removesuffix(")")
    assert shlex.split(command) == [
        "openshell-sandbox", "policy", "decide", "--policy", "/p/agent policy.yaml", "--host", "example.test",
        "--port", "443", "--binary", "/usr/bin/curl", "--ancestor", "/usr/bin/dash",
    ]  # fmt: skip


def test_a_refused_set_up_and_lost_enforcement_say_why() -> None:
    [refused] = console().lines_for({
        "event": "boundary.refused", "component": "control", "step": "attach",
        "error": {"kind": "failed", "reason": "cannot listen on 127.0.0.1:3128: Address already in use"},
    })  # fmt: skip
    assert refused == ("openshell-sandbox: the boundary refused the sandbox's set-up and exited: "
                       "cannot listen on 127.0.0.1:3128: Address already in use")  # fmt: skip
    [lost] = console().lines_for({"event": "enforcement-lost", "component": "boundary",
                                  "reason": "fence changed: new link veth0\x1b[2J"})  # fmt: skip
    assert lost.startswith("openshell-sandbox: enforcement lost, every workload process was killed: fence changed")
    assert "\x1b" not in lost
    assert console().lines_for({"event": "boundary.refused", "component": "boundary"}) == []


def test_allowed_connections_and_other_events_print_nothing() -> None:
    c = console()
    assert c.lines_for(deny(decision="allow")) == []
    assert c.lines_for({"event": "link.up", "component": "control"}) == []
    assert c.lines_for({"event": "http", "decision": "allow", "method": "GET", "destination": "a:443"}) == []


def test_an_l7_refusal_names_the_request_and_explains_it_with_method_and_path() -> None:
    [line] = console().lines_for(deny(event="http", method="POST", path="/repos/x", reason="l7-denied"))
    assert "HTTP:OTHER [MED] DENIED curl -> POST example.test:443/repos/x [reason:l7-denied]" in line
    assert "--method POST --path /repos/x" in line


def test_a_refusal_before_any_decision_has_no_explain_command() -> None:
    [line] = console().lines_for({"event": "egress.refused", "component": "boundary",
                                  "reason": "identity-unresolved: vanished", "destination": "10.0.0.1:80"})  # fmt: skip
    assert line == "openshell-sandbox: NET:REFUSE [MED] DENIED -> 10.0.0.1:80 [reason:identity-unresolved: vanished]"


def test_dns_refusals_are_said_once_per_name() -> None:
    c = console()
    first = c.lines_for({"event": "dns", "decision": "refused", "name": "x.test", "reason": "no-endpoint-for-name"})
    again = c.lines_for({"event": "dns", "decision": "refused", "name": "x.test", "qtype": "AAAA"})
    assert first == ["openshell-sandbox: refused DNS name x.test: no-endpoint-for-name"] and again == []


def test_what_the_agent_names_cannot_reach_the_terminal_raw() -> None:
    """Attacker's side: an executable named with an escape sequence, a bell, a newline and a bidi override."""
    evil = "/work/cur\x1b[2J\x1b]0;owned\x07l\nforged\u202e"
    [line] = console().lines_for(deny(binary=evil, destination="example.test:443"))
    assert "\x1b" not in line and "\x07" not in line and "\n" not in line and "\u202e" not in line
    assert "cur\\x1b[2J\\x1b]0;owned\\x07l\\nforged\\u202e -> example.test:443" in line
    assert all(ch.isprintable() for ch in summary(deny(binary=evil)))


def test_clean_leaves_printable_text_alone() -> None:
    assert clean("example.test:443 → ok é") == "example.test:443 → ok é"
    assert clean("a\tb") == "a\\tb"


def test_summary_lines_for_logs() -> None:
    line = summary({"time": "2026-12-01T14:35:07.271Z", **deny()})
    assert line == "14:35:07.271  control  egress  deny /usr/bin/curl → example.test:443  no-matching-endpoint"
    other = summary({"time": "2026-12-01T14:35:07.271Z", "event": "link.up", "component": "boundary",
                     "sandbox": "dev-1", "peer": "os-ctl", "links": 2})  # fmt: skip
    assert other == "14:35:07.271  boundary link.up  peer=os-ctl links=2"
    long = summary({"event": "x", "component": "control", "blob": "y" * 1000})
    assert len(long) < 300 and long.endswith("…")


def test_the_tail_returns_complete_lines_only_and_skips_garbage(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventsTail(path)
    assert tail.read() == []  # not there yet
    with path.open("w") as f:
        f.write(json.dumps({"event": "a"}) + "\nnot json\n[1]\n" + '{"event": "b"')
    assert tail.read() == [{"event": "a"}]
    with path.open("a") as f:
        f.write("}\n")
    assert tail.read() == [{"event": "b"}]
    assert tail.read() == []


def test_the_agents_oom_kill_is_said_with_the_limit_and_only_then() -> None:
    c = console()
    assert c.lines_for({"event": "limits.memory", "component": "boundary", "enforced": True, "limit": 256 << 20}) == []
    result = {"signal": "KILL", "rendered": 137, "reason": "oom-killed"}
    assert c.lines_for({"event": "agent.exited", "component": "control", "result": result}) == []  # once: boundary's
    [line] = c.lines_for({"event": "agent.exited", "component": "boundary", "result": result})
    assert "out of memory at the workload's memory limit (256 MiB)" in line and "--memory-limit" in line
    killed = {"signal": "KILL", "rendered": 137, "reason": "exited"}  # a SIGKILL that was no OOM kill
    assert c.lines_for({"event": "agent.exited", "component": "boundary", "result": killed}) == []


def test_status_shows_every_limit_and_why_one_is_unenforced() -> None:
    from supervisor.cli.client_commands import _limit_lines

    lines = _limit_lines({
        "pids": 64, "pids_cgroup": "cgroup v1 /sys/fs/cgroup/pids/x", "pids_current": 3,
        "memory": 256 << 20, "memory_cgroup": "cgroup v1 /sys/fs/cgroup/memory/x", "memory_current": 10 << 20,
        "memory_oom_kills": 1, "memory_swap": "capped", "oom_score_adj": 1000, "oom_score_adj_floor": True,
        "workdir_size": "unenforced", "workdir_size_reason": "no filesystem of its own",
        "tmp_size": "256m", "shm_size": "64m",
    })  # fmt: skip
    text = "\n".join(lines)
    assert lines[0].startswith("limits      pids") and len(lines) == 5, text
    for part in ("64  cgroup v1 /sys/fs/cgroup/pids/x, 3 now", "256 MiB  cgroup v1 /sys/fs/cgroup/memory/x",
                 "10 MiB now", "1 OOM kills", "oom_score_adj 1000", "unenforced: no filesystem of its own",
                 "/tmp size         256m", "/dev/shm size     64m"):  # fmt: skip
        assert part in text
    unenforced = _limit_lines({"pids": "unenforced", "pids_reason": "not writable", "memory": "unenforced",
                               "memory_reason": "memory is not delegated\x1b[2J", "oom_score_adj": "unenforced",
                               "oom_score_adj_reason": "model P"})  # fmt: skip
    text = "\n".join(unenforced)
    assert "pids              unenforced: not writable" in text and "\\x1b[2J" in text and "\x1b" not in text
    assert "oom_score_adj     unenforced: model P" in text


def test_logs_renders_human_json_and_ocsf_from_controls_json_lines() -> None:
    from supervisor.cli.logs import render

    raw = {"time": "2026-12-01T14:35:07.271Z", "sandbox": "dev-1", "pid": 42, **deny(binary="/usr/bin/python3")}
    line = json.dumps(raw).encode() + b"\n"
    assert render(line, "human") == (
        "14:35:07.271  control  NET:OPEN [MED] DENIED python3(42) -> example.test:443 [reason:no-matching-endpoint]"
    )
    assert json.loads(render(line, "json") or "") == raw
    [obj] = [json.loads(x) for x in (render(line, "ocsf") or "").splitlines()]
    assert (obj["class_uid"], obj["type_uid"], obj["time"]) == (4001, 400101, 1796135707271)
    assert obj["unmapped"]["sandbox"] == "dev-1" and obj["actor"]["process"]["cmd_line"] == "/usr/bin/python3"
    unknown = json.dumps({"event": "from.a-newer-control", "component": "control", "x": 1}).encode()
    assert render(unknown, "ocsf") is None and "from.a-newer-control" in (render(unknown, "human") or "")
    assert render(b"not json", "human") is None and render(b"\n", "json") is None


def test_after_a_policy_apply_the_why_hint_asks_the_generation_that_decided() -> None:
    c = Console(sandbox="dev-1", policy=Path("/p/agent.yaml"), policy_label="agent.yaml", events_path=EVENTS,
                api=Path("/run/o/dev-1/api.sock"), policy_source="/p/agent.yaml")  # fmt: skip
    [before] = c.lines_for(deny(policy_generation=0))
    assert "(why: openshell-sandbox policy decide --policy /p/agent.yaml --host" in before
    c.lines_for({"event": "policy.generation", "component": "control", "generation": 1, "status": "loaded",
                 "source": "PUT /v1/policy"})  # fmt: skip
    [after] = c.lines_for(deny(policy_generation=1))
    command = shlex.split(after.split("(why: ", 1)[1].removesuffix(")"))
    assert command[:7] == ["openshell-sandbox", "policy", "decide", "--api", "/run/o/dev-1/api.sock",
                           "--generation", "1"]  # fmt: skip
    c.lines_for(
        {
            "event": "policy.generation",
            "component": "control",
            "generation": 2,
            "status": "loaded",
            "source": "/p/agent.yaml",
        }
    )  # the watched file's own revision: the file says it again
    assert "--policy /p/agent.yaml" in c.lines_for(deny(policy_generation=2))[0]


def test_a_quarantined_policy_file_says_every_error_in_the_terminal_and_in_logs() -> None:
    event = {"event": "policy.generation", "component": "control", "generation": 3, "status": "quarantined",
             "source": "/p/agent.yaml", "errors": [
                 {"path": "network_policies.a.endpoints[0].port", "message": "invalid port 0",
                  "expected": "1..=65535", "line": 6, "source": "/p/agent.yaml"},
                 {"path": "network_policies.a.protocl", "message": "unknown key 'protocl'", "line": 7,
                  "source": "/p/agent.yaml"}]}  # fmt: skip
    assert console().lines_for(event) == [
        "openshell-sandbox: /p/agent.yaml is invalid; quarantined (generation 3): every new connection is denied "
        "until it is fixed:",
        "  /p/agent.yaml:6: network_policies.a.endpoints[0].port: invalid port 0 (expected 1..=65535)",
        "  /p/agent.yaml:7: network_policies.a.protocl: unknown key 'protocl'",
    ]
    line = summary(event)
    assert "status=quarantined" in line
    assert line.endswith("/p/agent.yaml:6: network_policies.a.endpoints[0].port: invalid port 0 (expected "
                         "1..=65535); /p/agent.yaml:7: network_policies.a.protocl: unknown key 'protocl'")  # fmt: skip


def test_an_origin_control_does_not_trust_is_named_with_the_certificate_problem_and_the_flag() -> None:
    event = {"event": "http", "component": "control", "decision": "error", "method": "GET",
             "destination": "api.corp.test:443", "path": "/v1", "binary": "/usr/bin/curl",
             "reason": "upstream-tls-failed", "detail": "the certificate of api.corp.test:443 failed verification: "
             "self-signed certificate in certificate chain"}  # fmt: skip
    assert console().lines_for(event) == [
        "openshell-sandbox: /usr/bin/curl → GET api.corp.test:443: upstream_tls_failed: the certificate of "
        "api.corp.test:443 failed verification: self-signed certificate in certificate chain; if the origin's CA is "
        "one you trust (a private or corporate CA), give it to control with --upstream-ca FILE"
    ]


def test_status_names_since_when_the_workload_is_gone_and_what_to_delete() -> None:
    from supervisor.cli.client_commands import _gone_lines

    gone = {"since": "2026-01-02T03:04:05Z", "seconds": 150, "delete": ["kubectl delete sandbox s"]}
    assert _gone_lines(gone) == [
        "workload    gone since 2026-01-02T03:04:05Z (2 min); remove the sandbox:",
        "  kubectl delete sandbox s",
    ]
    assert _gone_lines(None) == [] and _gone_lines({}) == []


def test_status_counts_activity_and_names_the_denial_groups_that_are_not_zero() -> None:
    from supervisor.cli.client_commands import _activity_lines

    activity = {"network_activity_count": 9, "denied_action_count": 3,
                "denials_by_group": {"ssrf": 1, "connect_policy": 2, "l7_policy": 0}}  # fmt: skip
    assert _activity_lines(activity) == ["activity    9 connections and requests, 3 denied (connect_policy 2, ssrf 1)"]
    assert _activity_lines({"network_activity_count": 1}) == ["activity    1 connections and requests, 0 denied"]
    assert _activity_lines(None) == []
