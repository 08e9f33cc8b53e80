"""Decisions (docs/reference/policy.md §3.3, §3.10) and the §5 bug classes, from the attacker's side where it
matters."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.control.policy import (
    BinaryIdentity,
    Decision,
    DenyReason,
    DigestPins,
    L4Request,
    Verdict,
    compile_policy,
    decide_l4,
    decide_l7,
)

from .policy_helpers import CURL, GIT, PY, compiled, l4, load, rule, who

pytestmark = pytest.mark.usefixtures("cold_l4_memos")

SHA_A, SHA_B = "a" * 64, "b" * 64
REST_ENFORCE = {"protocol": "rest", "enforcement": "enforce"}

BASIC = compiled(
    {
        "github": rule(
            {"host": "api.github.com", "port": 443, **REST_ENFORCE, "access": "read-only"},
            {"host": "*.githubusercontent.com", "ports": [443]},
            binaries=(GIT, "/usr/lib/git-core/*"),
        ),
        "pypi": rule(
            {"host": "pypi.org", "port": 443},
            {"host": "files.pythonhosted.org", "port": 443},
            binaries=("/usr/bin/python3*",),
        ),
        "lan": rule(
            {"port": 8443, "allowed_ips": ["10.0.0.0/24"]},
            {"host": "[2001:db8::5]", "port": 443},
            {"host": "git.internal.example", "port": 22, "protocol": "tcp"},
            binaries=("/usr/bin/ssh",),
        ),
        "raw": rule({"host": "stream.example.com", "port": 9000, "tls": "skip"}, binaries=(CURL,)),
    }
)

# (case, host, port, identity, verdict, rule, endpoint, reason)
L4_CASES: list[tuple[str, str, int, BinaryIdentity | None, Verdict, str | None, str | None, DenyReason | None]] = [
    ("exact", "api.github.com", 443, who(GIT), Verdict.ALLOW, "github", "github[0]", None),
    ("case-and-trailing-dot", "API.GitHub.com.", 443, who(GIT), Verdict.ALLOW, "github", "github[0]", None),
    ("glob", "raw.githubusercontent.com", 443, who(GIT), Verdict.ALLOW, "github", "github[1]", None),
    (
        "glob-too-deep",
        "a.raw.githubusercontent.com",
        443,
        who(GIT),
        Verdict.DENY,
        None,
        "a.raw.githubusercontent.com:443",
        DenyReason.NO_MATCHING_ENDPOINT,
    ),
    (
        "binary-glob",
        "api.github.com",
        443,
        who("/usr/lib/git-core/git-remote-https"),
        Verdict.ALLOW,
        "github",
        "github[0]",
        None,
    ),
    (
        "ancestor-grants",
        "api.github.com",
        443,
        who("/usr/bin/ssh-helper", "/bin/sh", GIT),
        Verdict.ALLOW,
        "github",
        "github[0]",
        None,
    ),
    (
        "ancestor-glob-grants",
        "pypi.org",
        443,
        who("/bin/sh", "/usr/bin/python3.11"),
        Verdict.ALLOW,
        "pypi",
        "pypi[0]",
        None,
    ),
    (
        "wrong-port",
        "api.github.com",
        80,
        who(GIT),
        Verdict.DENY,
        None,
        "api.github.com:80",
        DenyReason.NO_MATCHING_ENDPOINT,
    ),
    (
        "unknown-host",
        "evil.example.net",
        443,
        who(GIT),
        Verdict.DENY,
        None,
        "evil.example.net:443",
        DenyReason.NO_MATCHING_ENDPOINT,
    ),
    ("wrong-binary", "pypi.org", 443, who(GIT), Verdict.DENY, None, "pypi.org:443", DenyReason.BINARY_NOT_ALLOWED),
    (
        "argv-never-grants",
        "api.github.com",
        443,
        who(CURL, cmdline=(GIT,)),
        Verdict.DENY,
        None,
        "api.github.com:443",
        DenyReason.BINARY_NOT_ALLOWED,
    ),
    ("no-identity", "api.github.com", 443, None, Verdict.DENY, None, "api.github.com:443", DenyReason.IDENTITY_MISSING),
    (
        "empty-exe",
        "api.github.com",
        443,
        who(""),
        Verdict.DENY,
        None,
        "api.github.com:443",
        DenyReason.IDENTITY_MISSING,
    ),
    ("hostless", "anything.example.org", 8443, who("/usr/bin/ssh"), Verdict.ALLOW, "lan", "lan[0]", None),
    ("ipv6-spelling", "[2001:DB8:0::5]", 443, who("/usr/bin/ssh"), Verdict.ALLOW, "lan", "lan[1]", None),
    ("invalid-host", "a..b", 443, who(GIT), Verdict.DENY, None, None, DenyReason.INVALID_HOST),
    ("nul-host", "api.github.com\x00.evil", 443, who(GIT), Verdict.DENY, None, None, DenyReason.INVALID_HOST),
    ("port-zero", "api.github.com", 0, who(GIT), Verdict.DENY, None, None, DenyReason.INVALID_PORT),
    ("port-high", "api.github.com", 65536, who(GIT), Verdict.DENY, None, None, DenyReason.INVALID_PORT),
    ("encoded-dot-is-a-label", "api%2egithub.com", 443, who(GIT), Verdict.DENY, None, None, DenyReason.INVALID_HOST),
]


@pytest.mark.parametrize(
    ("case", "host", "port", "identity", "verdict", "rule_key", "endpoint", "reason"),
    L4_CASES,
    ids=[c[0] for c in L4_CASES],
)
def test_l4(
    case: str,
    host: str,
    port: int,
    identity: BinaryIdentity | None,
    verdict: Verdict,
    rule_key: str | None,
    endpoint: str | None,
    reason: DenyReason | None,
) -> None:
    d = decide_l4(BASIC, L4Request(host, port, identity))
    assert (d.verdict, d.rule, d.endpoint, d.reason) == (verdict, rule_key, endpoint, reason), d


def test_empty_policy_denies_everything() -> None:
    d = l4(compiled({}), "api.github.com")
    assert d.reason is DenyReason.NO_NETWORK_POLICIES and d.detail == "network connections not allowed by policy"


def test_binary_denial_names_each_rule_and_the_identity() -> None:
    d = l4(BASIC, "pypi.org", identity=who(GIT, "/bin/bash", cmdline=("/tmp/x",)))
    assert d.detail == (
        "binary '/usr/bin/git' (ancestors: [/bin/bash], cmdline: [/tmp/x]) not allowed in policy 'pypi'"
    )


def test_metadata_of_an_allowed_connection() -> None:
    d = l4(BASIC, "api.github.com")
    assert d.l7 and not d.tls_skip and d.exact_host and not d.transparent
    glob = l4(BASIC, "raw.githubusercontent.com")
    assert not glob.l7 and not glob.exact_host
    raw = l4(BASIC, "stream.example.com", 9000, who(CURL))
    assert raw.tls_skip and not raw.l7
    lan = l4(BASIC, "x.example.org", 8443, who("/usr/bin/ssh"))
    assert lan.allowed_ips == ("10.0.0.0/24",)
    tcp = l4(BASIC, "git.internal.example", 22, who("/usr/bin/ssh"))
    assert tcp.transparent and tcp.exact_host


def test_never_union_binaries_and_endpoints_across_rules() -> None:
    """§5 bug 33: curl may reach a, python may reach b; python may not reach a."""
    policy = compiled(
        {
            "a": rule({"host": "a.example.com", "port": 443}, binaries=(CURL,)),
            "b": rule({"host": "b.example.com", "port": 443}, binaries=(PY,)),
        }
    )
    assert l4(policy, "a.example.com", identity=who(CURL)).allowed
    assert l4(policy, "b.example.com", identity=who(PY)).allowed
    denied = l4(policy, "a.example.com", identity=who(PY))
    assert denied.reason is DenyReason.BINARY_NOT_ALLOWED


def test_smallest_key_wins_and_every_matching_rule_is_listed() -> None:
    policy = compiled(
        {"zeta": rule({"host": "a.example.com", "port": 443}), "alpha": rule({"host": "*.example.com", "port": 443})}
    )
    d = l4(policy, "a.example.com")
    assert (d.rule, d.endpoint, d.rules) == ("alpha", "alpha[0]", ("alpha", "zeta"))


def test_l7_endpoint_governs_over_plain_l4() -> None:
    policy = compiled(
        {
            "a": rule({"host": "api.example.com", "port": 443}),
            "b": rule({"host": "api.example.com", "port": 443, **REST_ENFORCE, "access": "read-only"}),
        }
    )
    d = l4(policy, "api.example.com")
    assert (d.rule, d.endpoint, d.l7) == ("b", "b[0]", True)
    assert decide_l7(policy, d, "POST", "/x").verdict is Verdict.DENY


def test_symlink_aliases_from_the_boundary() -> None:
    """§5 bug 3: a policy naming /usr/bin/python3 matches the kernel-resolved /usr/bin/python3.11."""
    policy = load({"py": rule({"host": "pypi.org", "port": 443}, binaries=(PY,))})
    plain = compile_policy(policy)
    aliased = compile_policy(policy, binary_aliases={PY: ["/usr/bin/python3.11"]})
    resolved = who("/usr/bin/python3.11")
    assert l4(plain, "pypi.org", identity=resolved).reason is DenyReason.BINARY_NOT_ALLOWED
    assert l4(aliased, "pypi.org", identity=resolved).allowed
    assert policy.binary_paths() == (PY,)


# --- digest pinning -------------------------------------------------------------------------------------


def test_tofu_pins_then_denies_a_changed_digest() -> None:
    pins = DigestPins()
    first = decide_l4(BASIC, L4Request("api.github.com", 443, who(GIT, sha=SHA_A)), pins)
    assert first.allowed and pins.pinned(GIT) == SHA_A
    swapped = decide_l4(BASIC, L4Request("api.github.com", 443, who(GIT, sha=SHA_B)), pins)
    assert swapped.reason is DenyReason.BINARY_DIGEST_CHANGED and SHA_A in swapped.detail and SHA_B in swapped.detail
    again = decide_l4(BASIC, L4Request("api.github.com", 443, who(GIT, sha=SHA_A.upper())), pins)
    assert again.allowed


def test_pins_recorded_even_when_policy_denies() -> None:
    pins = DigestPins()
    decide_l4(BASIC, L4Request("evil.example.net", 443, who(CURL, sha=SHA_A)), pins)
    assert pins.pinned(CURL) == SHA_A


def test_ancestors_are_matched_by_path_only() -> None:
    """The §4.2 identity carries no ancestor digests (the boundary hashes only the connecting binary): an ancestor
    neither pins nor is checked against a pin its path holds as a connecting binary."""
    pins = DigestPins()
    assert decide_l4(BASIC, L4Request("api.github.com", 443, who(GIT, sha=SHA_A)), pins).allowed
    child = BinaryIdentity("/bin/sh", SHA_B, (GIT,))
    assert pins.verify(child) is None
    assert (pins.pinned(GIT), pins.pinned("/bin/sh"), len(pins)) == (SHA_A, SHA_B, 2)


@pytest.mark.parametrize("digest", [None, "", "xyz", "a" * 63])
def test_missing_or_malformed_digest_denied_when_pinning(digest: str | None) -> None:
    d = decide_l4(BASIC, L4Request("api.github.com", 443, who(GIT, sha=digest)), DigestPins())
    assert d.reason is DenyReason.BINARY_DIGEST_MISSING


def test_pin_store_is_bounded() -> None:
    pins = DigestPins(limit=2)
    assert pins.verify(who("/a", sha=SHA_A)) is None
    assert pins.verify(who("/b", sha=SHA_A)) is None
    violation = pins.verify(who("/c", sha=SHA_A))
    assert violation is not None and "full" in violation.describe()
    assert len(pins) == 2


# --- L7 -------------------------------------------------------------------------------------------------


def l7(
    policy: Any, host: str, method: str, target: str, identity: BinaryIdentity | None = None, port: int = 443
) -> Decision:
    conn = l4(policy, host, port, identity)
    assert conn.allowed, conn
    return decide_l7(policy, conn, method, target)


# (method, target, verdict, reason) against api.github.com read-only, enforce
READ_ONLY = [
    ("GET", "/repos/a/b", Verdict.ALLOW, None),
    ("HEAD", "/repos/a/b", Verdict.ALLOW, None),
    ("OPTIONS", "/", Verdict.ALLOW, None),
    ("get", "/repos", Verdict.ALLOW, None),
    ("POST", "/repos/a/b/issues", Verdict.DENY, DenyReason.L7_NO_ALLOW_RULE),
    ("DELETE", "/repos/a/b", Verdict.DENY, DenyReason.L7_NO_ALLOW_RULE),
    ("GET", "/a/../..", Verdict.DENY, DenyReason.PATH_NOT_CANONICAL),
    ("GET", "/a/%2f/b", Verdict.DENY, DenyReason.PATH_NOT_CANONICAL),
    ("GET", "/a?x=%zz", Verdict.DENY, DenyReason.QUERY_INVALID),
    ("GE T", "/", Verdict.DENY, DenyReason.METHOD_INVALID),
]


@pytest.mark.parametrize(("method", "target", "verdict", "reason"), READ_ONLY)
def test_read_only_preset(method: str, target: str, verdict: Verdict, reason: DenyReason | None) -> None:
    d = l7(BASIC, "api.github.com", method, target)
    assert (d.verdict, d.reason, d.audit) == (verdict, reason, False), d
    assert d.rule == "github"


def test_presets() -> None:
    for preset, allowed, denied in (
        ("read-write", ["GET", "PATCH", "POST", "PUT"], ["DELETE"]),
        ("full", ["DELETE", "PROPFIND"], []),
    ):
        policy = compiled({"r": rule({"host": "a.example.com", "port": 443, **REST_ENFORCE, "access": preset})})
        for method in allowed:
            assert l7(policy, "a.example.com", method, "/x").allowed, (preset, method)
        for method in denied:
            assert not l7(policy, "a.example.com", method, "/x").allowed, (preset, method)


def test_head_implied_by_get_but_not_options() -> None:
    policy = compiled(
        {
            "r": rule(
                {
                    "host": "a.example.com",
                    "port": 443,
                    **REST_ENFORCE,
                    "rules": [{"allow": {"method": "GET", "path": "/x/**"}}],
                    "deny_rules": [{"method": "GET", "path": "/x/secret"}],
                }
            )
        }
    )
    assert l7(policy, "a.example.com", "HEAD", "/x/a").allowed
    assert not l7(policy, "a.example.com", "OPTIONS", "/x/a").allowed
    # ... and in deny rules too: a GET deny blocks HEAD
    assert l7(policy, "a.example.com", "HEAD", "/x/secret").reason is DenyReason.L7_DENIED


DENY_OVER_ALLOW = compiled(
    {
        "r": rule(
            {
                "host": "api.example.com",
                "port": 443,
                **REST_ENFORCE,
                "rules": [
                    {"allow": {"method": "*", "path": "/repos/**"}},
                    {
                        "allow": {
                            "method": "GET",
                            "path": "/search",
                            "query": {"q": "*", "sort": {"any": ["asc", "desc"]}},
                        }
                    },
                ],
                "deny_rules": [
                    {"method": "*", "path": "/repos/*/admin/**"},
                    {"method": "GET", "path": "/repos/**", "query": {"ref": "refs/heads/prod*"}},
                    {"method": "HEAD", "path": "/repos/*/secret"},
                ],
            }
        )
    }
)

L7_CASES = [
    ("allowed", "GET", "/repos/a/b", Verdict.ALLOW, None, "rules[0]"),
    ("deny-rule", "POST", "/repos/a/admin/x", Verdict.DENY, DenyReason.L7_DENIED, "deny_rules[0]"),
    ("smuggled-dotdot", "GET", "/repos/a/x/..;/admin/y", Verdict.DENY, DenyReason.L7_DENIED, "deny_rules[0]"),
    ("encoded-dots", "GET", "/repos/a/x/%2e%2e/admin/y", Verdict.DENY, DenyReason.L7_DENIED, "deny_rules[0]"),
    ("params-stripped", "GET", "/repos/a;x=1/admin;y/z", Verdict.DENY, DenyReason.L7_DENIED, "deny_rules[0]"),
    ("escape-allowed-root", "GET", "/repos/../admin", Verdict.DENY, DenyReason.L7_NO_ALLOW_RULE, None),
    (
        "deny-query-any-value",
        "GET",
        "/repos/a?ref=main&ref=refs/heads/prod-1",
        Verdict.DENY,
        DenyReason.L7_DENIED,
        "deny_rules[1]",
    ),
    ("deny-query-absent", "GET", "/repos/a?branch=refs/heads/prod", Verdict.ALLOW, None, "rules[0]"),
    ("allow-query", "GET", "/search?q=x&sort=asc", Verdict.ALLOW, None, "rules[1]"),
    ("allow-query-missing-key", "GET", "/search?q=x", Verdict.DENY, DenyReason.L7_NO_ALLOW_RULE, None),
    (
        "allow-query-every-value",
        "GET",
        "/search?q=x&sort=asc&sort=random",
        Verdict.DENY,
        DenyReason.L7_NO_ALLOW_RULE,
        None,
    ),
    ("allow-query-empty-value", "GET", "/search?q=&sort=desc", Verdict.ALLOW, None, "rules[1]"),
    ("deny-head-rule", "HEAD", "/repos/a/secret", Verdict.DENY, DenyReason.L7_DENIED, "deny_rules[2]"),
    ("get-not-denied-by-head-rule", "GET", "/repos/a/secret", Verdict.ALLOW, None, "rules[0]"),
    (
        "absolute-form",
        "GET",
        "https://api.example.com/repos/a/../a/admin/",
        Verdict.DENY,
        DenyReason.L7_DENIED,
        "deny_rules[0]",
    ),
]


@pytest.mark.parametrize(
    ("case", "method", "target", "verdict", "reason", "l7_rule"), L7_CASES, ids=[c[0] for c in L7_CASES]
)
def test_l7_rules(
    case: str, method: str, target: str, verdict: Verdict, reason: DenyReason | None, l7_rule: str | None
) -> None:
    d = l7(DENY_OVER_ALLOW, "api.example.com", method, target)
    assert (d.verdict, d.reason, d.l7_rule) == (verdict, reason, l7_rule), d


def test_plus_decodes_to_space_in_query() -> None:
    """§5 bug 23: 'a+b' is 'a b' for matching (a deny on 'a b' must fire on 'a+b' and 'a%20b')."""
    policy = compiled(
        {
            "r": rule(
                {
                    "host": "a.example.com",
                    "port": 443,
                    **REST_ENFORCE,
                    "access": "full",
                    "deny_rules": [{"method": "*", "path": "**", "query": {"q": "drop table*"}}],
                }
            )
        }
    )
    for target in ("/x?q=drop+table+users", "/x?q=drop%20table%20users", "/x?q=drop+table"):
        assert l7(policy, "a.example.com", "GET", target).reason is DenyReason.L7_DENIED, target
    assert l7(policy, "a.example.com", "GET", "/x?q=drop_table").allowed


def test_canonical_path_is_returned_for_forwarding() -> None:
    d = l7(DENY_OVER_ALLOW, "api.example.com", "GET", "//repos/./a/%62?x=1")
    assert (d.path, d.query) == ("/repos/a/b", "x=1")
    assert "x=1" not in str(d.to_json())  # query strings are never logged


def test_audit_mode_allows_but_flags() -> None:
    policy = compiled(
        {
            "r": rule(
                {
                    "host": "a.example.com",
                    "port": 443,
                    "protocol": "rest",
                    "access": "read-only",
                    "deny_rules": [{"method": "GET", "path": "/admin/**"}],
                }
            )
        }
    )
    post = l7(policy, "a.example.com", "POST", "/x")
    assert (post.verdict, post.audit, post.reason) == (Verdict.ALLOW, True, DenyReason.L7_NO_ALLOW_RULE)
    admin = l7(policy, "a.example.com", "GET", "/admin/x")
    assert (admin.verdict, admin.audit, admin.reason) == (Verdict.ALLOW, True, DenyReason.L7_DENIED)
    assert post.to_json()["audit"] is True and "audit" in post.describe()
    # a target that cannot be canonicalised is refused whatever the enforcement
    assert l7(policy, "a.example.com", "GET", "/..").verdict is Verdict.DENY


def test_allow_rules_union_over_matching_rules_per_binary() -> None:
    policy = compiled(
        {
            "curl-ro": rule(
                {"host": "api.example.com", "port": 443, **REST_ENFORCE, "access": "read-only"}, binaries=(CURL,)
            ),
            "py-full": rule({"host": "api.example.com", "port": 443, **REST_ENFORCE, "access": "full"}, binaries=(PY,)),
        }
    )
    assert not l7(policy, "api.example.com", "DELETE", "/x", who(CURL)).allowed
    full = l7(policy, "api.example.com", "DELETE", "/x", who(PY))
    assert full.allowed and full.rule == "py-full"
    both = l7(policy, "api.example.com", "DELETE", "/x", who(PY, CURL))
    assert both.allowed and both.rule == "py-full"


def test_deny_rule_in_any_matching_rule_blocks() -> None:
    policy = compiled(
        {
            "a": rule({"host": "api.example.com", "port": 443, **REST_ENFORCE, "access": "full"}),
            "b": rule(
                {
                    "host": "api.example.com",
                    "port": 443,
                    **REST_ENFORCE,
                    "access": "full",
                    "deny_rules": [{"method": "*", "path": "/secret/**"}],
                }
            ),
        }
    )
    d = l7(policy, "api.example.com", "GET", "/secret/x")
    assert (d.reason, d.rule) == (DenyReason.L7_DENIED, "b")


def test_encoded_slash_scope_does_not_leak_between_endpoints() -> None:
    """§5 bug 22: one endpoint's allow_encoded_slash must not open another's."""
    policy = compiled(
        {
            "r": rule(
                {
                    "host": "api.example.com",
                    "port": 443,
                    **REST_ENFORCE,
                    "access": "full",
                    "path": "/files/**",
                    "allow_encoded_slash": True,
                },
                {"host": "api.example.com", "port": 443, **REST_ENFORCE, "access": "full", "path": "/api/**"},
                {"host": "other.example.com", "port": 443, **REST_ENFORCE, "access": "full"},
            )
        }
    )
    ok = l7(policy, "api.example.com", "GET", "/files/a%2Fb")
    assert ok.allowed and ok.path == "/files/a%2Fb"
    assert l7(policy, "api.example.com", "GET", "/api/a%2Fb").reason is DenyReason.ENCODED_SLASH
    assert l7(policy, "other.example.com", "GET", "/a%2Fb").reason is DenyReason.PATH_NOT_CANONICAL
    assert l7(policy, "api.example.com", "GET", "/files/x%2F..%2Fy").reason is DenyReason.PATH_NOT_CANONICAL


def test_most_specific_endpoint_path_selects_enforcement() -> None:
    policy = compiled(
        {
            "r": rule(
                {"host": "api.example.com", "port": 443, "protocol": "rest", "access": "read-only"},
                {"host": "api.example.com", "port": 443, **REST_ENFORCE, "access": "read-only", "path": "/strict/**"},
            )
        }
    )
    assert l7(policy, "api.example.com", "POST", "/loose").audit
    strict = l7(policy, "api.example.com", "POST", "/strict/x")
    assert (strict.verdict, strict.endpoint) == (Verdict.DENY, "r[1]")


def test_no_endpoint_path_matched() -> None:
    policy = compiled(
        {"r": rule({"host": "api.example.com", "port": 443, **REST_ENFORCE, "access": "full", "path": "/v1/**"})}
    )
    assert l7(policy, "api.example.com", "GET", "/v2/x").reason is DenyReason.L7_NO_ENDPOINT_PATH
    assert l7(policy, "api.example.com", "GET", "/v1/x").allowed


def test_websocket_text_frames() -> None:
    policy = compiled(
        {
            "r": rule(
                {
                    "host": "ws.example.com",
                    "port": 443,
                    "protocol": "websocket",
                    "enforcement": "enforce",
                    "access": "read-only",
                }
            )
        }
    )
    assert l7(policy, "ws.example.com", "GET", "/socket").allowed
    assert l7(policy, "ws.example.com", "WEBSOCKET_TEXT", "/socket").reason is DenyReason.L7_NO_ALLOW_RULE
    rw = compiled(
        {
            "r": rule(
                {
                    "host": "ws.example.com",
                    "port": 443,
                    "protocol": "websocket",
                    "enforcement": "enforce",
                    "access": "read-write",
                }
            )
        }
    )
    assert l7(rw, "ws.example.com", "WEBSOCKET_TEXT", "/socket").allowed


def test_decide_l7_after_l4_denial_keeps_the_denial() -> None:
    denied = l4(BASIC, "evil.example.net")
    assert decide_l7(BASIC, denied, "GET", "/") is denied


def test_not_inspected_endpoint_passes_requests() -> None:
    d = l7(BASIC, "raw.githubusercontent.com", "DELETE", "/x")
    assert d.allowed and not d.l7 and d.reason is None
    assert d.path == "/x" and d.describe().endswith("raw.githubusercontent.com:443 DELETE /x")


def test_a_refused_target_keeps_the_request_in_the_decision() -> None:
    d = l7(BASIC, "api.github.com", "GET", "/a/../..")
    assert d.reason is DenyReason.PATH_NOT_CANONICAL and d.path == "/a/../.."
    assert "None" not in d.describe()


def test_decision_json_shape() -> None:
    body = l4(BASIC, "evil.example.net").to_json()
    assert body == {
        "result": "deny",
        "rule": None,
        "endpoint": "evil.example.net:443",
        "reason": "no-matching-endpoint",
        "audit": False,
        "l7": False,
        "detail": "endpoint evil.example.net:443 is not allowed by any policy",
        "destination": "evil.example.net:443",
    }
    allowed = l4(BASIC, "api.github.com").to_json()
    assert (allowed["result"], allowed["rule"], allowed["endpoint"], allowed["l7"]) == (
        "allow",
        "github",
        "github[0]",
        True,
    )


def test_reasons_are_the_logged_strings() -> None:
    assert {r.value for r in DenyReason} >= {
        "no-matching-endpoint",
        "binary-not-allowed",
        "binary-digest-changed",
        "identity-missing",
        "l7-denied",
        "l7-no-allow-rule",
        "path-not-canonical",
        "policy-quarantined",
    }
    assert all(r.value == str(r) for r in DenyReason)


def test_endpoints_for_name_for_the_dns_side() -> None:
    names = {
        "api.github.com": ["github[0]"],
        "raw.githubusercontent.com": ["github[1]"],
        "git.internal.example": ["lan[2]"],
        "anything.example.org": [],  # hostless endpoints never make a name eligible
        "evil.example.net": [],
    }
    for name, labels in names.items():
        assert [c.label for c in BASIC.endpoints_for_name(name)] == labels, name
    assert [c.label for c in BASIC.endpoints_for_name("git.internal.example", transparent_only=True)] == ["lan[2]"]
    assert BASIC.endpoints_for_name("api.github.com", transparent_only=True) == []


def test_relaxed_identity_decides_destinations_only() -> None:
    """Proxy-pod topology: binaries and pins are not decided on; destinations, ports and L7 still are."""
    policy = compiled({"a": rule({"host": "a.example.com", "port": 443}, binaries=(CURL,)),
                       "b": rule({"host": "b.example.com", "port": 443, **REST_ENFORCE, "access": "read-only"},
                                 binaries=(PY,))})  # fmt: skip
    pins = DigestPins()
    for identity in (None, who(PY), who("/tmp/evil", sha=SHA_A)):
        d = decide_l4(policy, L4Request("a.example.com", 443, identity, relaxed=True), pins)
        assert d.allowed and d.rule == "a"
    assert decide_l4(policy, L4Request("a.example.com", 443, None)).reason is DenyReason.IDENTITY_MISSING
    assert decide_l4(policy, L4Request("a.example.com", 8443, None, relaxed=True)).reason is (
        DenyReason.NO_MATCHING_ENDPOINT
    )
    assert not decide_l4(policy, L4Request("c.example.com", 443, None, relaxed=True)).allowed
    b = decide_l4(policy, L4Request("b.example.com", 443, None, relaxed=True))
    assert b.allowed and b.l7
    assert decide_l7(policy, b, "DELETE", "/x").reason is DenyReason.L7_NO_ALLOW_RULE
    assert len(pins) == 0  # nothing was pinned


def test_a_remembered_allow_still_answers_to_the_digest_pins() -> None:
    """decide_l4 remembers decisions per policy generation, but the pins are state and are checked every time: a
    binary swapped after its first allowed connection is denied on the very same request (the attacker replaces
    the pinned executable and reconnects to a destination it was allowed before)."""
    request = L4Request("api.github.com", 443, who(GIT, sha=SHA_A))
    pins = DigestPins()
    assert decide_l4(BASIC, request, pins).allowed
    assert decide_l4(BASIC, request, pins).allowed  # remembered
    other = DigestPins()
    assert other.verify(who(GIT, sha=SHA_B)) is None  # another pin store knows GIT by another digest
    denied = decide_l4(BASIC, request, other)
    assert denied.reason is DenyReason.BINARY_DIGEST_CHANGED and not denied.allowed
    assert decide_l4(BASIC, request, pins).allowed and other.pinned(GIT) == SHA_B  # nothing changed either store


def test_remembered_decisions_are_per_policy_generation_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("supervisor.control.policy.decide.L4_MEMO_LIMIT", 3)
    allowing = compiled({"github": rule({"host": "api.github.com", "port": 443})})
    denying = compiled({"github": rule({"host": "api.github.com", "port": 443}, binaries=(CURL,))})
    request = L4Request("API.GitHub.com.", 443, who(GIT))
    assert decide_l4(allowing, request).allowed
    assert decide_l4(denying, request).reason is DenyReason.BINARY_NOT_ALLOWED
    for port in range(1, 10):
        first = decide_l4(allowing, L4Request("api.github.com", port, who(GIT)))
        assert decide_l4(allowing, L4Request("api.github.com", port, who(GIT))) == first
        assert len(allowing.l4_memo) <= 3
    assert decide_l4(allowing, request).allowed
    assert decide_l4(denying, request) == decide_l4(compile_policy(denying.policy), request)
