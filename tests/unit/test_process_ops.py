"""Request validation for exec/signal/wait/terminate/forward, driven from the attacker's side."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from supervisor.boundary.process.environment import build_environment, build_process_spec, managed_env
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.process_ops import (
    MANAGED_ENV_KEYS,
    ExecRequest,
    SignalScope,
    parse_exec_request,
    parse_forward_request,
    parse_signal_request,
    parse_terminate_request,
    parse_wait_request,
    validate_forward_target,
)

H = "p_0123456789abcdef"


def refused(fn: Any, *args: Any) -> OpError:
    with pytest.raises(OpError) as info:
        fn(*args)
    return info.value


def test_exec_defaults() -> None:
    assert parse_exec_request({"argv": ["true"]}) == ExecRequest(argv=("true",))


def test_exec_full_and_aliases() -> None:
    req = parse_exec_request(
        {"command": ["sh", "-c", "x"], "environment": {"A": "1", "_b2": ""}, "workdir": "/tmp",
         "tty": True, "cols": 100, "rows": 30, "stdin": "null", "timeout_seconds": 2.5, "grace_s": 0}
    )  # fmt: skip
    assert req.argv == ("sh", "-c", "x")
    assert req.env == (("A", "1"), ("_b2", ""))
    assert (req.cwd, req.tty, req.cols, req.rows, req.stdin, req.timeout_s, req.grace_s) == (
        "/tmp", True, 100, 30, "null", 2.5, 0.0,
    )  # fmt: skip


EXEC_INVALID: list[tuple[Any, str | None]] = [
    ([], None),
    ({}, "argv"),
    ({"argv": []}, "argv"),
    ({"argv": "ls"}, "argv"),
    ({"argv": [""]}, "argv[0]"),
    ({"argv": ["ls", 1]}, "argv[1]"),
    ({"argv": ["ls\x00rm"]}, "argv[0]"),
    ({"argv": ["\ud800"]}, "argv[0]"),
    ({"argv": ["x" * (32 * 1024 + 1)]}, "argv[0]"),
    ({"argv": ["x"] * 1025}, "argv"),
    ({"argv": ["ls"], "shell": True}, "shell"),
    ({"argv": ["ls"], "command": ["ls"]}, "command"),
    ({"argv": ["ls"], "env": []}, "env"),
    ({"argv": ["ls"], "env": {"A=B": "x"}}, "env.A=B"),
    ({"argv": ["ls"], "env": {"A\x00": "x"}}, None),
    ({"argv": ["ls"], "env": {"": "x"}}, "env."),
    ({"argv": ["ls"], "env": {"1A": "x"}}, "env.1A"),
    ({"argv": ["ls"], "env": {"A\n": "x"}}, None),
    ({"argv": ["ls"], "env": {"A": "x\x00y"}}, "env.A"),
    ({"argv": ["ls"], "env": {"A": 1}}, "env.A"),
    ({"argv": ["ls"], "env": {"HTTPS_PROXY": "http://evil"}}, "env.HTTPS_PROXY"),
    ({"argv": ["ls"], "env": {"SSL_CERT_FILE": "/tmp/ca"}}, "env.SSL_CERT_FILE"),
    ({"argv": ["ls"], "env": {"OPENSHELL_SANDBOX": "0"}}, "env.OPENSHELL_SANDBOX"),
    ({"argv": ["ls"], "cwd": "tmp"}, "cwd"),
    ({"argv": ["ls"], "cwd": ""}, "cwd"),
    ({"argv": ["ls"], "cwd": "/tmp\n/x"}, "cwd"),
    ({"argv": ["ls"], "cwd": "/" + "a" * 4096}, "cwd"),
    ({"argv": ["ls"], "tty": 1}, "tty"),
    ({"argv": ["ls"], "cols": 0}, "cols"),
    ({"argv": ["ls"], "rows": 65536}, "rows"),
    ({"argv": ["ls"], "cols": True}, "cols"),
    ({"argv": ["ls"], "cols": 80.0}, "cols"),
    ({"argv": ["ls"], "stdin": "inherit"}, "stdin"),
    ({"argv": ["ls"], "timeout_s": -1}, "timeout_s"),
    ({"argv": ["ls"], "timeout_s": float("nan")}, "timeout_s"),
    ({"argv": ["ls"], "timeout_s": float("inf")}, "timeout_s"),
    ({"argv": ["ls"], "grace_s": "5"}, "grace_s"),
]


@pytest.mark.parametrize(("body", "field"), EXEC_INVALID)
def test_exec_invalid(body: Any, field: str | None) -> None:
    err = refused(parse_exec_request, body)
    assert err.kind is ErrorKind.INVALID
    if field is not None:
        assert err.field == field


@pytest.mark.parametrize("key", sorted(MANAGED_ENV_KEYS))
def test_every_managed_key_refused(key: str) -> None:
    err = refused(parse_exec_request, {"argv": ["ls"], "env": {key: "x"}})
    assert err.kind is ErrorKind.INVALID and "managed" in err.reason


def test_signal_requests() -> None:
    assert parse_signal_request({"handle": H, "signal": "TERM"}).signal == "TERM"
    req = parse_signal_request({"handle": H, "signal": "SIGWINCH", "scope": "group"})
    assert (req.signal, req.scope) == ("WINCH", SignalScope.GROUP)


@pytest.mark.parametrize(
    "body",
    [
        {"handle": H, "signal": 9},
        {"handle": H, "signal": "9"},
        {"handle": H, "signal": "0"},
        {"handle": H, "signal": "RTMIN"},
        {"handle": H, "signal": "SIGRTMIN+1"},
        {"handle": H, "signal": "SEGV"},
        {"handle": H, "signal": "term"},
        {"handle": H, "signal": "TERM", "scope": "session"},
        {"handle": H},
        {"handle": 1234, "signal": "TERM"},  # a pid is never a handle
        {"handle": "1234", "signal": "TERM"},
        {"handle": H.upper(), "signal": "TERM"},
        {"handle": H + "0", "signal": "TERM"},
        {"handle": H + "\n", "signal": "TERM"},
        {"handle": H, "signal": "TERM", "pid": 1},
    ],
)
def test_signal_invalid(body: Any) -> None:
    assert refused(parse_signal_request, body).kind is ErrorKind.INVALID


def test_wait_and_terminate() -> None:
    assert parse_wait_request({"handle": H}).timeout_s is None
    assert parse_wait_request({"handle": H, "timeout_s": 1}).timeout_s == 1.0
    assert parse_terminate_request({"handle": H}).grace_s == 5.0
    assert parse_terminate_request({"handle": H, "grace_s": 0.5}).grace_s == 0.5
    for body in ({"handle": H, "timeout_s": -1}, {}, {"handle": H, "grace_s": 1e9}):
        fn = parse_wait_request if "timeout_s" in body or not body else parse_terminate_request
        assert refused(fn, body).kind is ErrorKind.INVALID


FORWARD_OK = [
    ("127.0.0.1", "127.0.0.1", socket.AF_INET),
    ("127.3.4.5", "127.3.4.5", socket.AF_INET),
    ("localhost", "127.0.0.1", socket.AF_INET),
    ("LocalHost", "127.0.0.1", socket.AF_INET),
    ("[localhost]", "127.0.0.1", socket.AF_INET),
    ("::1", "::1", socket.AF_INET6),
    ("[::1]", "::1", socket.AF_INET6),
    ("0:0:0:0:0:0:0:1", "::1", socket.AF_INET6),
    ("::ffff:127.0.0.1", "127.0.0.1", socket.AF_INET),  # mapped → v4, dialled as v4
]


@pytest.mark.parametrize(("host", "literal", "family"), FORWARD_OK)
def test_forward_loopback(host: str, literal: str, family: socket.AddressFamily) -> None:
    target = validate_forward_target(host, 8080, {3128, 53})
    assert (target.host, target.port, target.family) == (literal, 8080, family)


FORWARD_REFUSED = [
    # not a literal (would need a resolver, or is a shorthand the C library would accept) → invalid
    ("localhost.", ErrorKind.INVALID),
    ("localhost.localdomain", ErrorKind.INVALID),
    ("127.1", ErrorKind.INVALID),
    ("2130706433", ErrorKind.INVALID),
    ("0x7f.0.0.1", ErrorKind.INVALID),
    ("0177.0.0.1", ErrorKind.INVALID),
    ("127.000.000.001", ErrorKind.INVALID),
    (" 127.0.0.1", ErrorKind.INVALID),
    ("127.0.0.1 ", ErrorKind.INVALID),
    ("127.0.0.1\n", ErrorKind.INVALID),
    ("::1%lo", ErrorKind.INVALID),
    ("[::1%25lo]", ErrorKind.INVALID),
    ("fe80::1%eth0", ErrorKind.INVALID),
    ("[[::1]]", ErrorKind.INVALID),
    ("[::1", ErrorKind.INVALID),
    ("ｌｏｃａｌｈｏｓｔ", ErrorKind.INVALID),
    ("١٢٧.0.0.1", ErrorKind.INVALID),
    ("", ErrorKind.INVALID),
    ("example.com", ErrorKind.INVALID),
    # literals that are not loopback → denied
    ("0.0.0.0", ErrorKind.DENIED),
    ("::", ErrorKind.DENIED),
    ("169.254.169.254", ErrorKind.DENIED),
    ("fe80::1", ErrorKind.DENIED),
    ("10.0.0.1", ErrorKind.DENIED),
    ("192.0.2.1", ErrorKind.DENIED),
    ("::ffff:169.254.169.254", ErrorKind.DENIED),
    ("::ffff:10.0.0.1", ErrorKind.DENIED),
    ("[::ffff:0.0.0.0]", ErrorKind.DENIED),
    ("::127.0.0.1", ErrorKind.DENIED),  # IPv4-compatible is not loopback
    ("::2", ErrorKind.DENIED),
    ("64:ff9b::7f00:1", ErrorKind.DENIED),  # NAT64 of 127.0.0.1
    ("2002:7f00:1::", ErrorKind.DENIED),  # 6to4 of 127.0.0.1
    ("224.0.0.1", ErrorKind.DENIED),
    ("255.255.255.255", ErrorKind.DENIED),
]


@pytest.mark.parametrize(("host", "kind"), FORWARD_REFUSED)
def test_forward_refused(host: str, kind: ErrorKind) -> None:
    err = refused(validate_forward_target, host, 8080)
    assert (err.kind, err.field) == (kind, "host")


@pytest.mark.parametrize("port", [0, -1, 65536, 70000, True, 80.0, "80", None])
def test_forward_bad_port(port: Any) -> None:
    err = refused(validate_forward_target, "127.0.0.1", port)
    assert (err.kind, err.field) == (ErrorKind.INVALID, "port")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2", "::ffff:127.0.0.1"])
def test_forward_reserved_port_denied_on_any_loopback(host: str) -> None:
    err = refused(validate_forward_target, host, 3128, {3128, 15001})
    assert (err.kind, err.field) == (ErrorKind.DENIED, "port")


def test_forward_host_types() -> None:
    assert refused(validate_forward_target, 2130706433, 80).kind is ErrorKind.INVALID
    assert refused(validate_forward_target, b"127.0.0.1", 80).kind is ErrorKind.INVALID
    assert parse_forward_request({"port": 22}).host == "127.0.0.1"
    assert refused(parse_forward_request, {"port": 22, "via": "x"}).field == "via"


# -- environment and launch spec (boundary/process/environment.py) --------------------------------------------


def test_managed_env_is_exactly_the_managed_keys() -> None:
    assert set(managed_env()) == MANAGED_ENV_KEYS
    assert set(managed_env(ca_cert=None, ca_bundle=None)) < MANAGED_ENV_KEYS


def test_every_tool_gets_the_ca_in_the_variable_it_reads() -> None:
    """docs/policy.md "Tools in the agent": the variables that replace a tool's store get the combined bundle
    (npm's ``cafile`` replaces node's roots, so it gets the bundle too); those that add to it, the CA alone."""
    env = managed_env(ca_cert="/ca.pem", ca_bundle="/bundle.pem")
    replacing = (
        "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "npm_config_cafile",
    )  # fmt: skip
    assert {key: env[key] for key in replacing} == dict.fromkeys(replacing, "/bundle.pem")
    assert {key: env[key] for key in ("NODE_EXTRA_CA_CERTS", "DENO_CERT")} == dict.fromkeys(
        ("NODE_EXTRA_CA_CERTS", "DENO_CERT"), "/ca.pem"
    )


def test_spec_environment_starts_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENSHELL_TLS_KEY", "/secret/key.pem")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "boundary-only")
    req = parse_exec_request({"argv": ["env"], "env": {"PATH": "/opt/bin", "TERM": "vt100", "X": "1"}})
    spec = build_process_spec(
        req, agent_uid=1000, agent_gid=1001, managed_env=managed_env(), default_cwd="/sandbox", landlock=None,
        user="agent", home="/home/agent", provider_env={"ANTHROPIC_API_KEY": "placeholder-1"},
    )  # fmt: skip
    assert dict(spec.env) == {
        "PATH": "/opt/bin", "HOME": "/home/agent", "USER": "agent", "SHELL": "/bin/bash", "TERM": "vt100",
        "OPENSHELL_SANDBOX": "1", "X": "1", "ANTHROPIC_API_KEY": "placeholder-1", **managed_env(),
    }  # fmt: skip
    assert (spec.argv, spec.cwd, spec.uid, spec.gid, spec.tty, spec.stdin) == (
        ("env",), "/sandbox", 1000, 1001, False, "pipe",
    )  # fmt: skip
    assert list(spec.env)[:6] == ["PATH", "HOME", "USER", "SHELL", "TERM", "OPENSHELL_SANDBOX"]


def test_spec_tty_and_cwd() -> None:
    req = parse_exec_request({"argv": ["sh"], "tty": True, "cols": 120, "rows": 50, "cwd": "/work"})
    spec = build_process_spec(req, agent_uid=1000, agent_gid=1000, managed_env={}, default_cwd="/x", landlock=None)
    assert (spec.tty, spec.cols, spec.rows, spec.cwd, spec.env["TERM"]) == (True, 120, 50, "/work", "xterm-256color")


@pytest.mark.parametrize(
    "user_env",
    [{"HTTPS_PROXY": "http://evil:1"}, {"OPENSHELL_SANDBOX": "0"}, {"A=B": "x"}, {"A": "x\x00"}, {"A\x00": "x"}],
)
def test_environment_rechecks_what_a_caller_passes(user_env: dict[str, str]) -> None:
    # a caller that skipped parse_exec_request still cannot override a managed key or smuggle a bad one
    err = refused(lambda: build_environment(user_env=user_env, managed=managed_env(), user="u", home="/h", tty=False))
    assert err.kind is ErrorKind.INVALID


def test_provider_env_cannot_carry_managed_keys() -> None:
    err = refused(
        lambda: build_environment(
            user_env={}, managed={}, user="u", home="/h", tty=False, provider_env={"SSL_CERT_FILE": "/x"}
        )
    )
    assert err.kind is ErrorKind.INVALID
