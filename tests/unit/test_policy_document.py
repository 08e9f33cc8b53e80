"""The document level of a policy (``supervisor/control/policy/schema.py``: version, sections, rules, binaries),
each refusal exactly as an operator reads it: path, message, what was expected, line and source."""

from __future__ import annotations

import locale
from pathlib import Path

import pytest

from supervisor.control.policy import (
    Binary,
    PolicyInvalid,
    load_default_policy,
    load_policy_file,
    load_policy_text,
)

RULES = "version: 1\nnetwork_policies:\n"
EP = "endpoints: [{host: a.example.com, port: 443}]"
KEY_EXPECTED = "letters, digits and _.:@- (starting with a letter or digit), at most 128 characters"
TOP_EXPECTED = "one of version, filesystem_policy, landlock, process, network_policies, network_middlewares"
NOT_ABSOLUTE = "an absolute path such as /usr/bin/git"


def binaries(entries: str) -> str:
    return f"{RULES}  a:\n    {EP}\n    binaries: {entries}\n"


# (case, document, [(path, message, expected, line)])
REFUSED: list[tuple[str, str, list[tuple[str, str, str | None, int | None]]]] = [
    ("empty", "", [("", "policy is empty", "a mapping with version: 1", None)]),
    (
        "syntax-only",
        "version: 1\nnetwork_policies: {a: [}\n",
        [("", "YAML syntax error: did not find expected node content", None, 2)],
    ),
    (
        "two-documents",
        "version: 1\n--- \nversion: 1\n",
        [("", "YAML syntax error: but found another document", None, 2)],
    ),
    ("a-list", "- a\n", [("", "expected a mapping, got a list", "a mapping", 1)]),
    ("no-version", "network_policies: {}\n", [("version", "missing required key 'version'", "version: 1", 1)]),
    (
        "no-version-below-the-top",
        "\n\nnetwork_policies: {}\n",
        [("version", "missing required key 'version'", "version: 1", 3)],
    ),
    ("version-2", "version: 2\n", [("version", "unsupported policy version 2", "1", 1)]),
    ("version-0", "version: 0\n", [("version", "unsupported policy version 0", "1", 1)]),
    ("version-string", "version: '1'\n", [("version", "expected an integer, got a string", "an integer", 1)]),
    ("version-null", "version:\n", [("version", "expected an integer, got null", "an integer", 1)]),
    (
        "sorted-by-line",
        "network_policies: {}\nfoo: 1\n",
        [
            ("version", "missing required key 'version'", "version: 1", 1),
            ("foo", "unknown key 'foo'", TOP_EXPECTED, 2),
        ],
    ),
    (
        "middleware",
        "version: 1\nnetwork_middlewares:\n  m: {}\n",
        [("network_middlewares", "network middleware is not supported yet", None, 3)],
    ),
    (
        "middlewares-a-list",
        "version: 1\nnetwork_middlewares: []\n",
        [("network_middlewares", "expected a mapping, got a list", "a mapping", 2)],
    ),
    (
        "rules-a-list",
        "version: 1\nnetwork_policies: []\n",
        [("network_policies", "expected a mapping, got a list", "a mapping", 2)],
    ),
    (
        "provider-key",
        f"{RULES}  _provider_x: {{{EP}, binaries: [{{path: /x}}]}}\n",
        [
            (
                "network_policies._provider_x",
                "rule keys starting with '_provider_' are reserved for provider rules",
                None,
                3,
            )
        ],
    ),
    (
        "provider-key-and-a-bad-rule",
        f"{RULES}  _provider_x: []\n",
        [
            (
                "network_policies._provider_x",
                "rule keys starting with '_provider_' are reserved for provider rules",
                None,
                3,
            ),
            ("network_policies._provider_x", "expected a mapping, got a list", "a mapping", 3),
        ],
    ),
    (
        "key-with-a-space",
        f"{RULES}  'a b': {{{EP}, binaries: [{{path: /x}}]}}\n",
        [("network_policies.a b", "invalid rule key 'a b'", KEY_EXPECTED, 3)],
    ),
    (
        "key-starting-with-a-dash",
        f"{RULES}  '-a': {{{EP}, binaries: [{{path: /x}}]}}\n",
        [("network_policies.-a", "invalid rule key '-a'", KEY_EXPECTED, 3)],
    ),
    (
        "key-too-long",
        f"{RULES}  {'k' * 129}: {{{EP}, binaries: [{{path: /x}}]}}\n",
        [(f"network_policies.{'k' * 129}", f"invalid rule key '{'k' * 129}'", KEY_EXPECTED, 3)],
    ),
    ("rule-a-list", f"{RULES}  a: []\n", [("network_policies.a", "expected a mapping, got a list", "a mapping", 3)]),
    (
        "rule-unknown-key",
        f"{RULES}  a: {{endpoint: [], binaries: []}}\n",
        [
            (
                "network_policies.a.endpoint",
                "unknown key 'endpoint'; did you mean 'endpoints'?",
                "one of name, endpoints, binaries",
                3,
            )
        ],
    ),
    (
        "name-not-a-string",
        f"{RULES}  a:\n    name: 5\n    {EP}\n    binaries: [{{path: /x}}]\n",
        [("network_policies.a.name", "expected a string, got an integer", "a string", 4)],
    ),
    (
        "endpoints-a-mapping",
        f"{RULES}  a:\n    endpoints: {{host: a}}\n    binaries: [{{path: /x}}]\n",
        [("network_policies.a.endpoints", "expected a list, got a mapping", "a list", 4)],
    ),
    (
        "binaries-a-mapping",
        f"{RULES}  a:\n    {EP}\n    binaries: {{path: /x}}\n",
        [("network_policies.a.binaries", "expected a list, got a mapping", "a list", 5)],
    ),
    (
        "second-endpoint-and-second-binary",
        f"{RULES}  a:\n    endpoints: [{{host: a.example.com, port: 443}}, {{host: b.example.com}}]\n"
        "    binaries: [{path: /x}, {path: y}]\n",
        [
            (
                "network_policies.a.endpoints[1].ports",
                "endpoint must declare at least one port",
                "port: N or ports: [N, ...]",
                4,
            ),
            ("network_policies.a.binaries[1].path", "binary path 'y' is not absolute", NOT_ABSOLUTE, 5),
        ],
    ),
    (
        "binary-a-string",
        binaries("[/usr/bin/git]"),
        [("network_policies.a.binaries[0]", "expected a mapping, got a string", "a mapping", 5)],
    ),
    (
        "binary-unknown-key",
        binaries("[{path: /x, paht: /y}]"),
        [
            (
                "network_policies.a.binaries[0].paht",
                "unknown key 'paht'; did you mean 'path'?",
                "one of path, harness, allow_loader_env",
                5,
            )
        ],
    ),
    (
        "harness-not-a-boolean",
        binaries("[{path: /x, harness: maybe}]"),
        [("network_policies.a.binaries[0].harness", "expected a boolean, got a string", "true or false", 5)],
    ),
    (
        "harness-not-a-boolean-and-no-path",
        binaries("[{harness: 1}]"),
        [
            ("network_policies.a.binaries[0].harness", "expected a boolean, got an integer", "true or false", 5),
            (
                "network_policies.a.binaries[0].path",
                "missing required key 'path'",
                "an absolute executable path or glob",
                5,
            ),
        ],
    ),
    (
        "loader-env-not-a-boolean",
        binaries("[{path: /x, allow_loader_env: 1}]"),
        [("network_policies.a.binaries[0].allow_loader_env", "expected a boolean, got an integer", "true or false", 5)],
    ),
    (
        "loader-env-not-a-boolean-and-no-path",
        binaries("[{allow_loader_env: 1}]"),
        [("network_policies.a.binaries[0].allow_loader_env", "expected a boolean, got an integer", "true or false", 5)],
    ),
    (
        "no-path",
        binaries("[{harness: true}]"),
        [
            (
                "network_policies.a.binaries[0].path",
                "missing required key 'path'",
                "an absolute executable path or glob",
                5,
            )
        ],
    ),
    (
        "empty-path",
        binaries("[{path: ''}]"),
        [("network_policies.a.binaries[0].path", "must not be empty", "a non-empty string", 5)],
    ),
    (
        "path-not-a-string",
        binaries("[{path: 5}]"),
        [("network_policies.a.binaries[0].path", "expected a string, got an integer", "a string", 5)],
    ),
    (
        "relative-glob",
        binaries("[{path: 'bin/*'}]"),
        [("network_policies.a.binaries[0].path", "binary path 'bin/*' is not absolute", NOT_ABSOLUTE, 5)],
    ),
    (
        "one-star-in-front",
        binaries("[{path: '*/git'}]"),
        [("network_policies.a.binaries[0].path", "binary path '*/git' is not absolute", NOT_ABSOLUTE, 5)],
    ),
    (
        "bad-glob",
        binaries("[{path: '/usr/[b*'}]"),
        [("network_policies.a.binaries[0].path", "invalid binary glob: unbalanced '[' at offset 5", None, 5)],
    ),
    (
        "static-section-and-rule",
        "version: 1\nfilesystem_policy: {read_only: [usr]}\nnetwork_policies:\n"
        "  a: {endpoints: [{host: a.example.com}], binaries: [{path: /x}]}\n",
        [
            ("filesystem_policy.read_only[0]", "path 'usr' is not absolute", "an absolute path", 2),
            (
                "network_policies.a.endpoints[0].ports",
                "endpoint must declare at least one port",
                "port: N or ports: [N, ...]",
                4,
            ),
        ],
    ),
    (
        "ambiguity",
        f"{RULES}  a:\n    endpoints: [{{host: a.example.com, port: 443, tls: skip}}]\n    binaries: [{{path: /x}}]\n"
        f"  b:\n    {EP}\n    binaries: [{{path: /y}}]\n",
        [
            (
                "network_policies.b.endpoints[0]",
                "network endpoint ambiguity: overlaps network_policies.a.endpoints[0] on port 443 but "
                "connection settings differ (protocol proxy, tls auto, allowed_ips [] vs protocol proxy, tls skip, "
                "allowed_ips [])",
                "overlapping endpoints to agree, or hosts/ports that do not overlap",
                7,
            )
        ],
    ),
]


@pytest.mark.parametrize(("case", "text", "errors"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_exactly(case: str, text: str, errors: list[tuple[str, str, str | None, int | None]]) -> None:
    with pytest.raises(PolicyInvalid) as info:
        load_policy_text(text, "d.yaml")
    assert [(e.path, e.message, e.expected, e.line) for e in info.value.errors] == errors
    assert {e.source for e in info.value.errors} == {"d.yaml"}


# (case, document, [(key, name, binaries)], [(warning path, message, line)])
ACCEPTED: list[tuple[str, str, list[tuple[str, str, tuple[Binary, ...]]], list[tuple[str, str, int]]]] = [
    ("no-rules", "version: 1\nnetwork_policies:\n", [], []),
    ("no-middleware", "version: 1\nnetwork_middlewares: {}\n", [], []),
    (
        "named",
        f"{RULES}  a:\n    name: Alpha\n    {EP}\n    binaries: [{{path: /x}}]\n",
        [("a", "Alpha", (Binary("/x"),))],
        [],
    ),
    (
        "empty-name",
        f"{RULES}  a:\n    name: ''\n    {EP}\n    binaries: [{{path: /x}}]\n",
        [("a", "a", (Binary("/x"),))],
        [],
    ),
    (
        "sorted-by-key",
        f"{RULES}  b: {{{EP}, binaries: [{{path: /x}}]}}\n  a: {{endpoints: [{{host: b.example.com, port: 443}}], "
        "binaries: [{path: /x}]}\n",
        [("a", "a", (Binary("/x"),)), ("b", "b", (Binary("/x"),))],
        [],
    ),
    (
        "key-of-128",
        f"{RULES}  {'k' * 128}: {{{EP}, binaries: [{{path: /x}}]}}\n",
        [("k" * 128, "k" * 128, (Binary("/x"),))],
        [],
    ),
    (
        "key-characters",
        f"{RULES}  'A0_.:@-z': {{{EP}, binaries: [{{path: /x}}]}}\n",
        [("A0_.:@-z", "A0_.:@-z", (Binary("/x"),))],
        [],
    ),
    (
        "binaries",
        binaries(
            "[{path: '**/git'}, {path: /x, harness: true}, {path: /h, harness: false}, "
            "{path: '/y/*', allow_loader_env: true}, {path: /z, allow_loader_env: false}, "
            "{path: /w, allow_loader_env: true}, {path: '/usr/[bin'}]"
        ),
        [
            (
                "a",
                "a",
                (
                    Binary("**/git"),
                    Binary("/x"),
                    Binary("/h"),
                    Binary("/y/*", True),
                    Binary("/z"),
                    Binary("/w", True),
                    Binary("/usr/[bin"),
                ),
            )
        ],
        [],
    ),
    (
        "no-endpoints",
        f"{RULES}  a:\n    binaries: [{{path: /x}}]\n",
        [("a", "a", (Binary("/x"),))],
        [("network_policies.a.endpoints", "rule has no endpoints and never matches", 4)],
    ),
    (
        "no-binaries",
        f"{RULES}  a:\n    {EP}\n",
        [("a", "a", ())],
        [("network_policies.a.binaries", "rule has no binaries and never matches", 4)],
    ),
    (
        "nothing",
        f"{RULES}  a: {{endpoints: [], binaries: []}}\n",
        [("a", "a", ())],
        [
            ("network_policies.a.endpoints", "rule has no endpoints and never matches", 3),
            ("network_policies.a.binaries", "rule has no binaries and never matches", 3),
        ],
    ),
]


@pytest.mark.parametrize(("case", "text", "rules", "warnings"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_exactly(
    case: str,
    text: str,
    rules: list[tuple[str, str, tuple[Binary, ...]]],
    warnings: list[tuple[str, str, int]],
) -> None:
    policy = load_policy_text(text, "d.yaml")
    assert policy.version == 1 and policy.source == "d.yaml"
    assert [(r.key, r.name, r.binaries) for r in policy.network_policies] == rules
    assert [(w.path, w.message, w.line) for w in policy.warnings] == warnings
    assert {w.source for w in policy.warnings} <= {"d.yaml"}


def test_the_sections_reach_the_policy() -> None:
    policy = load_policy_text(
        "version: 1\nfilesystem_policy: {read_only: [/usr]}\nlandlock: {compatibility: hard_requirement}\n"
        f"process: {{run_as_user: sandbox}}\nnetwork_policies:\n  a: {{{EP}, binaries: [{{path: /x}}]}}\n"
    )
    assert policy.static_json() == {
        "filesystem_policy": {"include_workdir": False, "read_only": ["/usr"], "read_write": []},
        "landlock": {"compatibility": "hard_requirement"},
        "process": {"run_as_user": "sandbox"},
    }
    (rule,) = policy.network_policies
    assert [(ep.host, ep.ports) for ep in rule.endpoints] == [("a.example.com", (443,))]
    assert policy.source == "<string>"


def test_without_sections_they_are_none() -> None:
    policy = load_policy_text("version: 1\n")
    assert (policy.filesystem_policy, policy.landlock, policy.process, policy.network_policies) == (
        None,
        None,
        None,
        (),
    )


def test_a_file_is_read_as_utf8_and_named_in_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(f"{RULES}  a: {{endpoints: [{{host: bücher.example, port: 443}}], binaries: [{{path: /x}}]}}\n")
    policy = load_policy_file(good)
    assert policy.source == str(good)
    assert policy.network_policies[0].endpoints[0].host == "xn--bcher-kva.example"
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 2\n")
    with pytest.raises(PolicyInvalid) as info:
        load_policy_file(bad)
    assert [(e.path, e.line, e.source) for e in info.value.errors] == [("version", 1, str(bad))]


def test_a_file_is_utf8_whatever_the_locale(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(
        f"{RULES}  a: {{endpoints: [{{host: bücher.example, port: 443}}], binaries: [{{path: /x}}]}}\n".encode()
    )
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale: a read in the locale's encoding would fail
    try:
        policy = load_policy_file(path)
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    assert policy.network_policies[0].endpoints[0].host == "xn--bcher-kva.example"


def test_an_unreadable_file_is_one_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    not_utf8 = tmp_path / "latin1.yaml"
    not_utf8.write_bytes(b"version: 1\n# caf\xe9\n")
    for path in (missing, not_utf8, tmp_path):
        with pytest.raises(PolicyInvalid) as info:
            load_policy_file(path)
        (error,) = info.value.errors
        assert (error.path, error.expected, error.line, error.source) == ("", None, None, str(path))
        assert error.message.startswith("cannot read policy file: ")
    with pytest.raises(PolicyInvalid) as info:
        load_policy_file(missing)
    assert info.value.errors[0].message == f"cannot read policy file: [Errno 2] No such file or directory: '{missing}'"
    with pytest.raises(PolicyInvalid) as info:
        load_policy_file(not_utf8)
    assert "can't decode byte 0xe9" in info.value.errors[0].message
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


def test_the_default_policy_names_its_source() -> None:
    policy = load_default_policy()
    assert policy.source == "default_policy.yaml"
    assert policy.warnings == ()
    assert policy.static_json() == {
        "filesystem_policy": {"include_workdir": False, "read_only": [], "read_write": []},
        "landlock": {"compatibility": "best_effort"},
        "process": {},
    }
