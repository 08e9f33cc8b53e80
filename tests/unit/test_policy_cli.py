"""``policy check`` and ``policy decide`` through ``run_policy`` with a parser built here, plus one subprocess."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli.policy import add_policy_parser, run_policy

GOOD = """version: 1
network_policies:
  github:
    endpoints:
      - host: api.github.com
        port: 443
        protocol: rest
        enforcement: enforce
        access: read-only
      - host: "*.githubusercontent.com"
        port: 443
    binaries:
      - path: /usr/bin/git
  pypi:
    endpoints:
      - {host: pypi.org, port: 443}
    binaries:
      - path: /usr/bin/python3*
"""

THREE_ERRORS = """version: 1
network_policies:
  github:
    endpoints:
      - host: api.github.com
        ports: [443, 0]
        protocl: rest
    binaries:
      - path: git
"""


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="openshell-sandbox")
    add_policy_parser(top.add_subparsers(dest="command"))
    return top


def run(*argv: str) -> tuple[int, str, str]:
    args = parser().parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    code = run_policy(args, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    return path


def test_check_ok(good: Path) -> None:
    assert run("policy", "check", str(good)) == (0, "ok: 2 rules, 3 endpoints\n", "")


def test_check_lists_all_three_errors_with_paths_and_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(THREE_ERRORS)
    code, out, err = run("policy", "check", str(path))
    assert code == 1
    assert out.splitlines() == [
        f"{path}:6: network_policies.github.endpoints[0].ports[1]: invalid port 0 (expected 1..=65535)",
        f"{path}:7: network_policies.github.endpoints[0].protocl: unknown key 'protocl'; did you mean 'protocol'? "
        "(expected one of host, port, ports, path, protocol, tls, enforcement, access, rules, deny_rules, "
        "allowed_ips, allow_encoded_slash, websocket_credential_rewrite, request_body_credential_rewrite, "
        "allow_uninspected_credentials, credential_binding, credential_signing, signing_service, signing_region, "
        "persisted_queries, graphql_persisted_queries, graphql_max_body_bytes, json_rpc, mcp)",
        f"{path}:9: network_policies.github.binaries[0].path: binary path 'git' is not absolute "
        "(expected an absolute path such as /usr/bin/git)",
    ]
    assert err == f"{path}: 3 errors\n"


def test_check_json(tmp_path: Path, good: Path) -> None:
    code, out, _ = run("policy", "check", str(good), "--json")
    body = json.loads(out)
    assert code == 0 and (body["ok"], body["rules"], body["endpoints"]) == (True, 2, 3) and len(body["hash"]) == 64
    bad = tmp_path / "bad.yaml"
    bad.write_text(THREE_ERRORS)
    code, out, _ = run("policy", "check", str(bad), "--json")
    body = json.loads(out)
    assert code == 1 and body["ok"] is False
    assert [(e["path"], e["line"]) for e in body["errors"]] == [
        ("network_policies.github.endpoints[0].ports[1]", 6),
        ("network_policies.github.endpoints[0].protocl", 7),
        ("network_policies.github.binaries[0].path", 9),
    ]


def test_check_warnings_go_to_stderr(tmp_path: Path) -> None:
    path = tmp_path / "audit.yaml"
    path.write_text(
        "version: 1\nnetwork_policies:\n  a:\n    endpoints: [{host: a.example.com, port: 443, "
        "protocol: rest, access: full}]\n    binaries: [{path: /x}]\n"
    )
    code, out, err = run("policy", "check", str(path))
    assert code == 0 and out == "ok: 1 rules, 1 endpoints\n" and "audit mode" in err and ":4:" in err


def test_check_missing_file(tmp_path: Path) -> None:
    code, out, _ = run("policy", "check", str(tmp_path / "nope.yaml"))
    assert code == 1 and "cannot read policy file" in out


DECIDE = [
    (
        ["--host", "api.github.com", "--port", "443", "--binary", "/usr/bin/git"],
        0,
        "allow github (github[0]) api.github.com:443 [L7 inspected]",
    ),
    (
        ["--host", "api.github.com", "--port", "443", "--binary", "/usr/bin/curl"],
        1,
        "deny api.github.com:443: binary-not-allowed: binary '/usr/bin/curl' (ancestors: []) not allowed in "
        "policy 'github'",
    ),
    (
        ["--host", "api.github.com", "--port", "443", "--binary", "/bin/sh", "--ancestor", "/usr/bin/git"],
        0,
        "allow github (github[0]) api.github.com:443 [L7 inspected]",
    ),
    (
        ["--host", "api.github.com", "--port", "443", "--binary", "/usr/bin/git", "--loader-env", "LD_PRELOAD"],
        1,
        "deny api.github.com:443: binary-not-allowed: binary '/usr/bin/git' (ancestors: [], started with "
        "LD_PRELOAD: only binaries with allow_loader_env match) not allowed in policy 'github'",
    ),
    (
        ["--host", "evil.example.net", "--port", "443", "--binary", "/usr/bin/git"],
        1,
        "deny evil.example.net:443: no-matching-endpoint: endpoint evil.example.net:443 is not allowed by any policy",
    ),
    (
        ["--host", "api.github.com", "--port", "443"],
        1,
        "deny api.github.com:443: identity-missing: the initiating process could not be identified",
    ),
    (
        [
            "--host",
            "api.github.com",
            "--port",
            "443",
            "--binary",
            "/usr/bin/git",
            "--method",
            "GET",
            "--path",
            "/repos/a/b",
        ],
        0,
        "allow github (github[0]) api.github.com:443 GET /repos/a/b by access:read-only",
    ),
    (
        [
            "--host",
            "api.github.com",
            "--port",
            "443",
            "--binary",
            "/usr/bin/git",
            "--method",
            "POST",
            "--path",
            "/repos/a/b",
        ],
        1,
        "deny api.github.com:443 POST /repos/a/b: l7-no-allow-rule: POST /repos/a/b not permitted by policy",
    ),
]


@pytest.mark.parametrize(("argv", "code", "line"), DECIDE)
def test_decide(good: Path, argv: list[str], code: int, line: str) -> None:
    assert run("policy", "decide", "--policy", str(good), *argv) == (code, line + "\n", "")


def test_decide_json(good: Path) -> None:
    code, out, _ = run(
        "policy",
        "decide",
        "--policy",
        str(good),
        "--host",
        "pypi.org",
        "--port",
        "443",
        "--binary",
        "/usr/bin/python3.11",
        "--sha256",
        "ab" * 32,
        "--json",
    )
    body = json.loads(out)
    assert code == 0
    assert {k: body[k] for k in ("result", "rule", "endpoint", "reason")} == {
        "result": "allow",
        "rule": "pypi",
        "endpoint": "pypi[0]",
        "reason": None,
    }
    code, out, _ = run(
        "policy",
        "decide",
        "--policy",
        str(good),
        "--host",
        "pypi.org",
        "--port",
        "443",
        "--binary",
        "/usr/bin/git",
        "--json",
    )
    body = json.loads(out)
    assert code == 1 and (body["result"], body["reason"]) == ("deny", "binary-not-allowed")


@pytest.mark.parametrize("extra", [["--method", "GET"], ["--path", "/"], ["--port", "0"]])
def test_decide_usage_errors(good: Path, extra: list[str]) -> None:
    argv = ["policy", "decide", "--policy", str(good), "--host", "a.example.com", "--port", "443", *extra]
    code, out, err = run(*argv)
    assert code == 2 and out == "" and err


def test_decide_invalid_policy_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(THREE_ERRORS)
    code, out, err = run("policy", "decide", "--policy", str(bad), "--host", "a.example.com", "--port", "443")
    assert code == 2 and out == "" and "ports[1]" in err


def test_argparse_usage_exit_code() -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["policy", "decide", "--host", "x"])
    assert info.value.code == 2


def test_subprocess_check(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(THREE_ERRORS)
    script = (
        "import argparse,sys\nfrom supervisor.cli.policy import add_policy_parser, run_policy\n"
        "p = argparse.ArgumentParser(); add_policy_parser(p.add_subparsers())\n"
        "sys.exit(run_policy(p.parse_args(sys.argv[1:])))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "policy", "check", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert len(proc.stdout.splitlines()) == 3 and proc.stderr.strip() == f"{bad}: 3 errors"


def test_docs_example_is_true(tmp_path: Path) -> None:
    """docs/policy.md: the example policy loads and every console session shown prints what the page says."""
    import re
    import shlex

    page = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", page, re.S)
    assert example is not None
    policy = tmp_path / "agent-policy.yaml"
    policy.write_text(example.group(1))
    sessions = 0
    for block in re.findall(r"```console\n(.*?)```", page, re.S):
        lines = block.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ openshell-sandbox policy") or "agent-policy.yaml" not in line:
                continue
            argv = [str(policy) if a == "agent-policy.yaml" else a for a in shlex.split(line[2:])[1:]]
            code, out, _ = run(*argv)
            assert out.strip() == lines[i + 1].strip(), line
            assert code == (0 if out.startswith(("ok", "allow")) else 1)
            sessions += 1
    assert sessions == 4


def test_decide_loader_env_names_only_loader_variables(good: Path) -> None:
    with pytest.raises(SystemExit) as info:
        run("policy", "decide", "--policy", str(good), "--host", "a.example.com", "--port", "443",
            "--loader-env", "PATH")  # fmt: skip
    assert info.value.code == 2


def test_decide_relaxed_identity_ignores_binaries(good: Path) -> None:
    """The proxy-pod topology decides destinations only; without it, no identity is a denial."""
    argv = ["policy", "decide", "--policy", str(good), "--host", "pypi.org", "--port", "443", "--json"]
    code, out, _ = run(*argv)
    assert code == 1 and json.loads(out)["reason"] == "identity-missing"
    code, out, err = run(*argv, "--binary-identity", "relaxed")
    assert code == 0 and json.loads(out)["rule"] == "pypi"
    assert "relaxed" in err and "binaries" in err
    code, out, _ = run(*argv, "--binary", "/usr/bin/git", "--binary-identity", "relaxed")
    assert code == 0  # the binary is not decided on
    code, out, _ = run("policy", "decide", "--policy", str(good), "--host", "evil.example.com", "--port", "443",
                       "--binary-identity", "relaxed", "--json")  # fmt: skip
    assert code == 1 and json.loads(out)["reason"] == "no-matching-endpoint"


PROTOCOLS = """\
version: 1
network_policies:
  tools:
    endpoints:
      - host: mcp.example.com
        port: 443
        path: /mcp
        protocol: mcp
        enforcement: enforce
        mcp: {allow_all_known_mcp_methods: true}
        rules:
          - allow: {tool: {any: [echo, get_weather]}}
      - host: node.example.com
        port: 443
        protocol: json-rpc
        enforcement: enforce
        rules:
          - allow: {method: eth_blockNumber}
      - host: api.github.com
        port: 443
        path: /graphql
        protocol: graphql
        enforcement: enforce
        access: read-only
    binaries:
      - path: /usr/bin/python3
"""


@pytest.mark.parametrize(
    ("host", "flag", "value", "code", "shown"),
    [
        ("mcp.example.com", "--mcp-tool", "echo", 0, "[tools/call echo]"),
        ("mcp.example.com", "--mcp-tool", "delete_repo", 1, "[tools/call delete_repo]"),
        ("node.example.com", "--rpc-method", "eth_blockNumber", 0, "[eth_blockNumber]"),
        ("node.example.com", "--rpc-method", "eth_sendTransaction", 1, "[eth_sendTransaction]"),
        ("api.github.com", "--graphql", "query Me { viewer { login } }", 0, "[query Me]"),
        ("api.github.com", "--graphql", "mutation { addStar(input: {}) { clientMutationId } }", 1, "[mutation"),
    ],
)
def test_decide_protocol_bodies(tmp_path: Path, host: str, flag: str, value: str, code: int, shown: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(PROTOCOLS)
    got, out, err = run("policy", "decide", "--policy", str(path), "--host", host, "--port", "443",
                        "--binary", "/usr/bin/python3", flag, value)  # fmt: skip
    assert got == code and shown in out, (out, err)


def test_decide_graphql_file_json(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(PROTOCOLS)
    doc = tmp_path / "q.graphql"
    doc.write_text("query Viewer { viewer { login } }")
    got, out, _ = run("policy", "decide", "--policy", str(path), "--host", "api.github.com", "--port", "443",
                      "--binary", "/usr/bin/python3", "--graphql", f"@{doc}", "--json")  # fmt: skip
    body = json.loads(out)
    assert got == 0 and body["operation"] == "query Viewer" and body["l7_rule"] == "access:read-only"


TYPO = """version: 1
network_policies:
  a:
    endpoints:
      - {host: a.example.com, port: 443}
    binaries:
      - path: /usr/bin/pyhton3
      - path: /bin/sh
      - path: /nowhere/bin/*
      - path: /usr/**/python3
"""


def test_check_warns_for_binary_paths_absent_on_this_machine(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    code, out, err = run("policy", "check", str(path))
    assert (code, out) == (0, "ok: 1 rules, 1 endpoints\n")
    assert err.splitlines() == [
        f"{path}:7: network_policies.a.binaries[0].path: warning: binary path '/usr/bin/pyhton3' matches no file "
        "on this machine; the rule never matches a process running it (a typo?)",
        f"{path}:9: network_policies.a.binaries[2].path: warning: binary path '/nowhere/bin/*' matches no file "
        "on this machine; the rule never matches a process running it (a typo?)",
    ]


def test_check_strict_makes_absent_binary_paths_errors(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    code, out, err = run("policy", "check", "--strict", str(path))
    assert code == 1
    assert [line.split(": ")[1] for line in out.splitlines()] == [
        "network_policies.a.binaries[0].path", "network_policies.a.binaries[2].path",
    ]  # fmt: skip
    assert "warning" not in out and err == f"{path}: 2 errors (--strict)\n"
    code, body, _ = run("policy", "check", "--strict", "--json", str(path))
    assert code == 1 and [e["line"] for e in json.loads(body)["errors"]] == [7, 9]
