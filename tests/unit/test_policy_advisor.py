"""The policy advisor from the attacker's side (supervisor/control/advisor.py, denials.py): the agent chooses the
hosts, paths, tools and binary names it is denied on, and tries to get a suggestion that grants more than that.
Each test asserts what is proposed, that it decides as intended, and that nothing else changed in the document."""

from __future__ import annotations

import io
import json
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.cli.policy_suggest import parse_since, run_suggest, suggest_hint
from supervisor.control.advisor import render, suggest
from supervisor.control.denials import MAX_SAMPLES, DenialEntry, DenialTable
from supervisor.control.policy import (
    BinaryIdentity,
    L4Request,
    Policy,
    compile_policy,
    decide_l4,
    decide_l7,
    load_policy_text,
)
from supervisor.protocol.event_names import EventName as E
from supervisor.protocol.event_record import Event

BASE = """\
version: 1
network_policies:
  api:
    endpoints:
      - host: api.test
        port: 8000
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {method: GET, path: /hello.txt}
    binaries: [{path: /usr/bin/curl}]
  ro:
    endpoints:
      - host: ro.test
        port: 443
        protocol: rest
        enforcement: enforce
        access: read-only
    binaries: [{path: /usr/bin/curl}]
  guarded:
    endpoints:
      - host: guarded.test
        port: 443
        protocol: rest
        enforcement: enforce
        access: full
        deny_rules: [{method: DELETE, path: "/**"}]
    binaries: [{path: /usr/bin/curl}]
  tools:
    endpoints:
      - host: mcp.test
        port: 443
        protocol: mcp
        enforcement: enforce
        rules:
          - allow: {method: initialize}
    binaries: [{path: /usr/bin/node}]
  gql:
    endpoints:
      - host: gql.test
        port: 443
        protocol: graphql
        enforcement: enforce
        rules:
          - allow: {operation_type: query, operation_name: Known}
    binaries: [{path: /usr/bin/node}]
  rpc:
    endpoints:
      - host: rpc.test
        port: 443
        protocol: json-rpc
        enforcement: enforce
        rules:
          - allow: {method: eth_blockNumber}
    binaries: [{path: /usr/bin/node}]
"""
WRITABLE = ["/work", "/tmp", "/dev/shm"]
CURL = "/usr/bin/curl"


def policy() -> Policy:
    return load_policy_text(BASE, "base.yaml")


def table(*events: tuple[E, dict[str, Any]]) -> DenialTable:
    t = DenialTable(refusals=frozenset({E.EGRESS_REFUSED}))
    for name, fields in events:
        t.observe(Event.build(name, "control", "dev-1", **fields))
    return t


def l4(host: str, port: int, binary: str | None = CURL, reason: str = "no-matching-endpoint",
       **extra: Any) -> tuple[E, dict[str, Any]]:  # fmt: skip
    fields = {"decision": "deny", "destination": f"{host}:{port}", "capture": "connect", "binary": binary,
              "ancestors": ["/usr/bin/dash"], "reason": reason, **extra}  # fmt: skip
    return E.EGRESS, fields


def l7(host: str, port: int, method: str, path: str, *, endpoint: str = "api[0]", reason: str = "l7-no-allow-rule",
       operation: str | None = None) -> tuple[E, dict[str, Any]]:  # fmt: skip
    rule = endpoint.split("[")[0]
    return E.HTTP, {"decision": "deny", "destination": f"{host}:{port}", "binary": CURL, "method": method, "path": path,
                    "rule": rule, "endpoint": endpoint, "reason": reason, "operation": operation}  # fmt: skip


def run(*events: tuple[E, dict[str, Any]], writable: list[str] = WRITABLE) -> tuple[Any, Policy]:
    result = suggest(policy(), table(*events).entries(), writable)
    text = render(result.document)
    revised = load_policy_text(text, "suggested.yaml")  # what `policy check` runs
    return result, revised


def added_rules(revised: Policy) -> dict[str, Any]:
    """The rules of ``revised`` that are new or differ from the base policy's, as JSON."""
    base = policy().to_json()["network_policies"]
    return {k: v for k, v in revised.to_json()["network_policies"].items() if base.get(k) != v}


def allows(revised: Policy, host: str, port: int, binary: str = CURL) -> bool:
    return decide_l4(compile_policy(revised), L4Request(host, port, BinaryIdentity(binary, None, ()))).allowed


def allows_path(revised: Policy, host: str, port: int, method: str, path: str, binary: str = CURL) -> bool:
    compiled = compile_policy(revised)
    decision = decide_l4(compiled, L4Request(host, port, BinaryIdentity(binary, None, ())))
    return decision.allowed and decide_l7(compiled, decision, method, path).allowed


# --- L4 ------------------------------------------------------------------------------------------------------------


def test_l4_denial_becomes_one_rule_with_the_binaries_seen() -> None:
    result, revised = run(l4("plain.test", 8000), l4("plain.test", 8000, "/usr/bin/wget"), l4("plain.test", 8000))
    assert added_rules(revised) == {"suggested-plain-test-8000": {
        "endpoints": [{"host": "plain.test", "ports": [8000]}],
        "binaries": [{"path": CURL}, {"path": "/usr/bin/wget"}]}}  # fmt: skip
    assert allows(revised, "plain.test", 8000) and allows(revised, "plain.test", 8000, "/usr/bin/wget")
    assert not allows(revised, "plain.test", 8001) and not allows(revised, "other.test", 8000)
    assert not allows(revised, "plain.test", 8000, "/usr/bin/python3")
    assert not result.refused


def test_binary_not_allowed_copies_the_endpoint_with_the_exact_host_only() -> None:
    """The new binary gets what the others get on that endpoint — the L7 rules included — and no more."""
    _, revised = run(l4("api.test", 8000, "/usr/bin/wget", reason="binary-not-allowed"))
    (rule,) = added_rules(revised).values()
    assert rule["endpoints"] == [policy().rule("api").endpoints[0].to_json()]  # type: ignore[union-attr]
    assert allows_path(revised, "api.test", 8000, "GET", "/hello.txt", "/usr/bin/wget")
    assert not allows_path(revised, "api.test", 8000, "GET", "/other", "/usr/bin/wget")


@pytest.mark.parametrize("binary", ["/work/curl", "/work/sub/dir/curl", "/tmp/curl", "/dev/shm/x", "/work"])
def test_binary_on_a_path_the_agent_writes_is_never_proposed(binary: str) -> None:
    result, revised = run(l4("plain.test", 8000, binary))
    assert added_rules(revised) == {}
    assert [why for _, why in result.refused] == [result.refused[0][1]] and "can write" in result.refused[0][1]


def test_writable_prefix_is_a_directory_not_a_string_prefix() -> None:
    _, revised = run(l4("plain.test", 8000, "/workshop/bin/curl"))
    assert allows(revised, "plain.test", 8000, "/workshop/bin/curl")


@pytest.mark.parametrize("binary", ["/usr/bin/*", "/**", "/usr/bin/cu?l", "/usr/bin/[c]url", "/usr/{bin,sbin}/x",
                                    "/usr/bin/cu\\rl", "relative/curl", "/usr/bin/a b", "/usr/bin/x\ny",
                                    "/work/../usr/bin/curl", "-", None])  # fmt: skip
def test_binary_that_would_read_as_a_pattern_or_is_unknown_is_refused(binary: str | None) -> None:
    result, revised = run(l4("plain.test", 8000, binary))
    assert added_rules(revised) == {} and len(result.refused) == 1


@pytest.mark.parametrize("host", ["*.evil.test", "**.test", "evil.*", "ev?l.test", "[a].test", "{a,b}.test",
                                  "localhost", "a..test", "a.test.", "evil.test\nnetwork_policies: {}", "x y.test",
                                  "-bad.test", "EVIL.TEST"])  # fmt: skip
def test_wildcard_or_unusual_host_is_refused(host: str) -> None:
    result, revised = run(l4(host, 443))
    assert added_rules(revised) == {} and len(result.refused) == 1


@pytest.mark.parametrize("address", ["10.0.0.5", "127.0.0.1", "169.254.169.254", "192.168.1.1", "100.64.0.1",
                                     "::1", "fd00::1", "203.0.113.9", "0.0.0.0"])  # fmt: skip
def test_internal_ip_literal_is_refused(address: str) -> None:
    result, revised = run(l4(address, 443))
    assert added_rules(revised) == {} and "internal" in result.refused[0][1]


@pytest.mark.parametrize(("address", "net"), [("8.8.8.8", "8.8.8.8/32"), ("2606:4700::1111", "2606:4700::1111/128")])
def test_ip_literal_becomes_allowed_ips_never_host(address: str, net: str) -> None:
    _, revised = run(l4(address, 9443))
    (rule,) = added_rules(revised).values()
    assert rule["endpoints"] == [{"ports": [9443], "allowed_ips": [net]}]
    assert allows(revised, address, 9443) and not allows(revised, address, 9444)


def test_a_proposal_the_policy_check_refuses_is_listed_with_the_error() -> None:
    """A hostless endpoint overlaps every endpoint on its port (§1.11): on 443 it disagrees with the others."""
    result, revised = run(l4("8.8.8.8", 443), l4("plain.test", 8000))
    assert list(added_rules(revised)) == ["suggested-plain-test-8000"]
    assert "ambiguity" in result.refused[0][1]


@pytest.mark.parametrize("reason", ["internal-address", "always-blocked", "allowed-ips-check-failed",
                                    "control-local", "invalid-host"])  # fmt: skip
def test_ssrf_refusals_are_never_proposed(reason: str) -> None:
    result, revised = run(l4("db.internal.test", 8000, reason=reason))
    assert added_rules(revised) == {} and "SSRF" in result.refused[0][1]


def test_bypass_and_other_l4_reasons_are_never_proposed() -> None:
    refused = (E.EGRESS_REFUSED, {"destination": "plain.test:443", "reason": "identity-unresolved: no-record"})
    result, revised = run(refused, l4("a.test", 1, reason="binary-digest-changed"),
                          l4("b.test", 1, reason="policy-quarantined"))  # fmt: skip
    assert added_rules(revised) == {} and len(result.refused) == 3
    assert any("bypass" in why for _, why in result.refused)


def test_loader_env_is_never_proposed() -> None:
    result, revised = run(l4("plain.test", 8000, loader_env=["LD_PRELOAD"]))
    assert added_rules(revised) == {} and "allow_loader_env" in result.refused[0][1]
    assert "allow_loader_env" not in render(result.document)


# --- L7 ------------------------------------------------------------------------------------------------------------


def test_l7_path_denial_adds_exactly_that_rule() -> None:
    result, revised = run(l7("api.test", 8000, "GET", "/work/README"), l7("api.test", 8000, "POST", "/upload"))
    rules = revised.rule("api").endpoints[0].rules  # type: ignore[union-attr]
    assert [(r.method, r.path) for r in rules] == [("GET", "/hello.txt"), ("GET", "/work/README"), ("POST", "/upload")]
    assert allows_path(revised, "api.test", 8000, "GET", "/work/README")
    assert not allows_path(revised, "api.test", 8000, "GET", "/work/README2")
    assert not allows_path(revised, "api.test", 8000, "GET", "/work/other")
    assert not allows_path(revised, "api.test", 8000, "POST", "/work/README")
    assert list(added_rules(revised)) == ["api"] and not result.generalised


@pytest.mark.parametrize("path", ["/a/**", "/**", "**", "/a/*", "/a/?", "/a/[x]", "/a/{b,c}", "/a\\*", "/a b",
                                  "relative", "/a?q=1", "/a/../etc", "/a/./b",
                                  "/x\n- allow: {method: '*'}"])  # fmt: skip
def test_paths_that_would_read_as_patterns_are_refused(path: str) -> None:
    result, revised = run(l7("api.test", 8000, "GET", path))
    assert added_rules(revised) == {} and len(result.refused) == 1


def test_generalised_only_from_several_samples_sharing_a_prefix_and_said() -> None:
    events = [l7("api.test", 8000, "GET", f"/v1/items/{n}") for n in (1, 2, 3)]
    result, revised = run(*events, l7("api.test", 8000, "GET", "/v1/two/a"), l7("api.test", 8000, "GET", "/v1/two/b"))
    paths = [r.path for r in revised.rule("api").endpoints[0].rules]  # type: ignore[union-attr]
    assert paths == ["/hello.txt", "/v1/items/*", "/v1/two/a", "/v1/two/b"]
    assert len(result.generalised) == 1 and "3 samples" in result.generalised[0]
    assert not allows_path(revised, "api.test", 8000, "GET", "/v1/items/1/deeper")  # * never crosses /


def test_top_level_segments_are_never_generalised() -> None:
    """Three denials of /a, /b, /c must not become /* (every single-segment path)."""
    _, revised = run(*(l7("api.test", 8000, "GET", f"/{name}") for name in "abc"))
    paths = [r.path for r in revised.rule("api").endpoints[0].rules]  # type: ignore[union-attr]
    assert paths == ["/hello.txt", "/a", "/b", "/c"]
    assert not allows_path(revised, "api.test", 8000, "GET", "/d")


def test_a_redacted_placeholder_segment_becomes_one_star_and_is_said() -> None:
    result, revised = run(l7("api.test", 8000, "GET", "/keys/[CREDENTIAL]/info"))
    paths = [r.path for r in revised.rule("api").endpoints[0].rules]  # type: ignore[union-attr]
    assert paths == ["/hello.txt", "/keys/*/info"] and "[CREDENTIAL]" in result.generalised[0]


def test_access_preset_is_written_out_then_extended() -> None:
    _, revised = run(l7("ro.test", 443, "POST", "/submit", endpoint="ro[0]"))
    endpoint = revised.rule("ro").endpoints[0]  # type: ignore[union-attr]
    assert endpoint.access is None
    assert [(r.method, r.path) for r in endpoint.rules or ()] == [
        ("GET", "**"), ("HEAD", "**"), ("OPTIONS", "**"), ("POST", "/submit")]  # fmt: skip
    assert allows_path(revised, "ro.test", 443, "POST", "/submit")
    assert not allows_path(revised, "ro.test", 443, "POST", "/other")


def test_explicit_deny_rule_is_never_lifted() -> None:
    result, revised = run(l7("guarded.test", 443, "DELETE", "/x", endpoint="guarded[0]", reason="l7-denied"))
    assert added_rules(revised) == {} and "deny_rules" in result.refused[0][1]


def test_parse_rejections_and_mismatches_are_not_proposed() -> None:
    events = [l7("api.test", 8000, "GET", "/x", reason="request_authority_mismatch"),
              l7("api.test", 8000, "GET", "/y", reason="credential_endpoint_mismatch")]  # fmt: skip
    result, revised = run(*events)
    assert added_rules(revised) == {} and len(result.refused) == 1 and "before the policy" in result.refused[0][1]


def test_mcp_graphql_and_json_rpc_calls() -> None:
    result, revised = run(
        l7("mcp.test", 443, "POST", "/mcp", endpoint="tools[0]", operation="tools/call read_file"),
        l7("mcp.test", 443, "POST", "/mcp", endpoint="tools[0]", operation="resources/list"),
        l7("gql.test", 443, "POST", "/graphql", endpoint="gql[0]", operation="query Viewer"),
        l7("rpc.test", 443, "POST", "/", endpoint="rpc[0]", operation="eth_call"),
    )
    doc = revised.to_json()["network_policies"]
    assert doc["tools"]["endpoints"][0]["rules"][1:] == [
        {"allow": {"method": "tools/call", "tool": "read_file"}},
        {"allow": {"method": "resources/list"}},
    ]
    assert doc["gql"]["endpoints"][0]["rules"][1:] == [
        {"allow": {"operation_type": "query", "operation_name": "Viewer"}}
    ]
    assert doc["rpc"]["endpoints"][0]["rules"][1:] == [{"allow": {"method": "eth_call"}}]  # fmt: skip
    assert not result.refused


@pytest.mark.parametrize(("endpoint", "operation"), [
    ("tools[0]", "tools/call *"), ("tools[0]", "tools/call read_*"), ("tools[0]", "tools/*"),
    ("tools[0]", "tools/call a b"), ("tools[0]", None),
    ("gql[0]", "query (anonymous)"), ("gql[0]", "query *"), ("gql[0]", "3 operations, last query X"),
    ("gql[0]", "persisted abc"), ("gql[0]", "query Na…"),
    ("rpc[0]", "*"), ("rpc[0]", "eth_*"), ("rpc[0]", "a b")])  # fmt: skip
def test_body_calls_that_would_read_as_patterns_or_grant_more_are_refused(endpoint: str, operation: str) -> None:
    host = {"tools[0]": "mcp.test", "gql[0]": "gql.test", "rpc[0]": "rpc.test"}[endpoint]
    result, revised = run(l7(host, 443, "POST", "/", endpoint=endpoint, operation=operation))
    assert added_rules(revised) == {} and len(result.refused) == 1


# --- the YAML ------------------------------------------------------------------------------------------------------

YAML_SHAPES = ["/&anchor", "/!!python/object:os.system", "/'q'", '/"q"', "/a:b", "/#c", "/-y", "/|", "/>", "/%0a",
               "/null", "/true", "/~", "/@a,b", "/a: {method: '*'}"]  # fmt: skip


def test_yaml_shapes_in_paths_stay_strings() -> None:
    """The serializer writes every string the agent chose: loaded back they are the same strings, nothing more."""
    result, revised = run(*(l7("api.test", 8000, "GET", p) for p in YAML_SHAPES))
    paths = [r.path for r in revised.rule("api").endpoints[0].rules]  # type: ignore[union-attr]
    assert sorted(paths) == sorted(["/hello.txt", *YAML_SHAPES[:-1]])  # the last holds spaces and a glob: refused
    assert len(result.refused) == 1
    assert list(added_rules(revised)) == ["api"]
    assert yaml.safe_load(render(result.document)) == result.document


# --- the table -----------------------------------------------------------------------------------------------------


def test_table_is_bounded_and_keeps_samples_distinct() -> None:
    t = table(*(l7("api.test", 8000, "GET", f"/p{n}") for n in range(MAX_SAMPLES + 5)),
              l7("api.test", 8000, "GET", "/p0"))  # fmt: skip
    (entry,) = t.entries()
    assert len(entry.samples) == MAX_SAMPLES and entry.samples_dropped == 5 and entry.count == MAX_SAMPLES + 6
    assert entry.samples[("GET", "/p0", None)].count == 2
    small = DenialTable(max_entries=3)
    for n in range(5):
        small.observe(Event.build(E.EGRESS, "control", None, **l4(f"h{n}.test", 443)[1]))
    assert [e.host for e in small.entries()] == ["h2.test", "h3.test", "h4.test"] and small.evicted == 2


def test_truncated_text_is_never_proposed() -> None:
    result, revised = run(l7("api.test", 8000, "GET", "/" + "a" * 2000))
    assert added_rules(revised) == {} and "cut" in result.refused[0][1]


def test_entries_round_trip_through_the_api_shape() -> None:
    t = table(l4("plain.test", 8000, loader_env=["LD_PRELOAD"]), l7("mcp.test", 443, "POST", "/", endpoint="tools[0]",
                                                                     operation="tools/call x"))  # fmt: skip
    for entry in t.entries():
        assert DenialEntry.from_json(json.loads(json.dumps(entry.to_json()))) == entry


def test_non_denials_are_not_aggregated() -> None:
    t = table((E.EGRESS, {"decision": "allow", "destination": "a.test:1", "binary": CURL}),
              (E.HTTP, {"decision": "audit", "destination": "a.test:1", "method": "GET", "path": "/"}),
              (E.DNS, {"decision": "refused", "name": "a.test"}))  # fmt: skip
    assert t.entries() == []


# --- the command ---------------------------------------------------------------------------------------------------


def _events_file(tmp_path: Path, *events: tuple[E, dict[str, Any]]) -> Path:
    path = tmp_path / "events.jsonl"
    lines = [Event.build(E.AGENT_FILESYSTEM, "boundary", "dev-1", read_write=["/work"]).json_line()]
    lines += [Event.build(name, "control", "dev-1", **fields).json_line() for name, fields in events]
    path.write_text("".join(lines) + "not json\n")
    return path


def _args(**kw: Any) -> Namespace:
    base = {"since": None, "out": None, "events": None, "policy": None, "api": None, "cert": None}
    return Namespace(**{**base, **kw})


def test_suggest_from_events_writes_a_checked_file_and_a_diff(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(BASE)
    events = _events_file(tmp_path, l4("plain.test", 8000), l4("plain.test", 8000, "/work/curl"),
                          l7("api.test", 8000, "GET", "/work/README"))  # fmt: skip
    out, err = io.StringIO(), io.StringIO()
    target = tmp_path / "suggested.yaml"
    code = run_suggest(_args(events=events, policy=tmp_path / "policy.yaml", out=target), out, err)
    assert code == 0, err.getvalue()
    revised = load_policy_text(target.read_text(), "suggested.yaml")
    assert set(added_rules(revised)) == {"api", "suggested-plain-test-8000"}
    assert "+  suggested-plain-test-8000:" in out.getvalue() and "+          path: /work/README" in out.getvalue()
    assert "not proposed: plain.test:8000 by /work/curl" in err.getvalue()
    assert "policy apply" in err.getvalue()


def test_suggest_with_nothing_to_propose_exits_1(tmp_path: Path) -> None:
    events = _events_file(tmp_path, l4("db.internal.test", 8000, reason="internal-address"))
    out, err = io.StringIO(), io.StringIO()
    assert run_suggest(_args(events=events), out, err) == 1 and out.getvalue() == ""


def test_since_and_the_dev_hint(tmp_path: Path) -> None:
    events = _events_file(tmp_path, l4("plain.test", 8000))
    assert run_suggest(_args(events=events, since="2999-01-01T00:00:00Z"), io.StringIO(), io.StringIO()) == 1
    assert run_suggest(_args(events=events, since="1h"), io.StringIO(), io.StringIO()) == 0
    assert run_suggest(_args(events=events, since="yesterday"), io.StringIO(), io.StringIO()) == 2
    assert parse_since("1970-01-01T00:00:01Z") == 1000
    hint = suggest_hint(events, Path("/p/policy.yaml"))
    assert hint is not None and f"policy suggest --events {events} --policy /p/policy.yaml" in hint
    quiet = _events_file(tmp_path, (E.EGRESS, {"decision": "allow", "destination": "a.test:1"}))
    assert suggest_hint(quiet, None) is None
