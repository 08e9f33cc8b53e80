"""Glob semantics of docs/reference/policy.md §2, one table per dialect, plus the overlap test used by §1.11."""

from __future__ import annotations

import pytest

from supervisor.control.policy.globs import (
    GlobSyntaxError,
    compile_host_glob,
    compile_path_glob,
    compile_value_glob,
    host_pattern_matches,
    path_globs_intersect,
)
from supervisor.control.policy.hosts import normalize_request_host, validate_policy_host

# §2.1 (pattern, host, matches)
HOSTS = [
    ("*.example.com", "api.example.com", True),
    ("*.example.com", "example.com", False),
    ("*.example.com", "a.b.example.com", False),
    ("**.example.com", "a.example.com", True),
    ("**.example.com", "a.b.example.com", True),
    ("**.example.com", "example.com", False),
    ("*-aiplatform.googleapis.com", "us-central1-aiplatform.googleapis.com", True),
    ("*-aiplatform.googleapis.com", "us-central1.aiplatform.googleapis.com", False),
    ("*.s3.*.amazonaws.com", "b.s3.us-east-1.amazonaws.com", True),
    ("*.s3.*.amazonaws.com", "s3.us-east-1.amazonaws.com", False),
    ("*.s3.*.amazonaws.com", "b.s3.dualstack.us-east-1.amazonaws.com", False),
    ("*.example.com", "evil%2eexample.com", False),  # percent-encoding is not decoded: one label
    ("*.example.com", "api.example.com.evil.net", False),
    ("api?.*.example.com", "api1.x.example.com", True),
    ("api?.*.example.com", "api.x.example.com", False),
    ("api[0-9].*.example.com", "api7.x.example.com", True),
    ("api[0-9].*.example.com", "apix.x.example.com", False),
    ("api.example.com", "api.example.com", True),
    ("api.example.com", "api.example.com.", False),  # matching sees normalised hosts only
]


@pytest.mark.parametrize(("pattern", "host", "expected"), HOSTS)
def test_host_glob(pattern: str, host: str, expected: bool) -> None:
    if "*" not in pattern:
        # §2.1: hosts without '*' are compared by plain equality, no glob processing at all
        assert host_pattern_matches(pattern, host) is expected
        return
    assert compile_host_glob(pattern).matches(host) is expected


def test_host_without_star_is_literal() -> None:
    assert host_pattern_matches("api?.example.com", "api?.example.com")
    assert not host_pattern_matches("api?.example.com", "api1.example.com")


def test_upper_case_pattern_is_lowered_by_validation() -> None:
    host, problem = validate_policy_host("*.EXAMPLE.COM", tcp=False)
    assert problem is None
    assert compile_host_glob(host).matches("api.example.com")


REQUEST_HOSTS = [
    ("API.Example.COM", "api.example.com"),
    ("api.example.com.", "api.example.com"),
    ("bücher.example", "xn--bcher-kva.example"),
    ("[2001:DB8::1]", "2001:db8::1"),
    ("2001:db8:0:0::1", "2001:db8::1"),
    ("10.0.0.1", "10.0.0.1"),
    ("a..b", None),
    ("", None),
    (".", None),
    ("a b.com", None),
    ("a\x00.com", None),
    ("evil.com/x", None),
    ("fe80::1%eth0", None),
    ("a.example.com..", None),
    ("x" * 64 + ".com", None),
]


@pytest.mark.parametrize(("raw", "expected"), REQUEST_HOSTS)
def test_request_host_normalisation(raw: str, expected: str | None) -> None:
    assert normalize_request_host(raw) == expected


# §2.2 (pattern, path, matches)
PATHS = [
    ("**", "/anything/at/all", True),
    ("**", "/", True),
    ("/repos/**", "/repos/", True),
    ("/repos/**", "/repos/a", True),
    ("/repos/**", "/repos/a/b", True),
    ("/repos/**", "/repos", False),  # D3
    ("/repos/*/issues", "/repos/x/issues", True),
    ("/repos/*/issues", "/repos/x/y/issues", False),  # D2: '*' never crosses '/'
    ("/**/info/refs*", "/info/refs", True),
    ("/**/info/refs*", "/org/repo.git/info/refs", True),
    ("/**/info/refs*", "/org/repo.git/info/refs.txt", True),
    ("**/x", "/x", True),
    ("**/x", "/a/b/x", True),
    ("**/x", "/ax", False),
    ("/a**", "/abc", True),  # '**' next to other characters is '*'
    ("/a**", "/a/b", False),
    ("/v?/x", "/v1/x", True),
    ("/v?/x", "/v//x", False),
    ("/v[12]/x", "/v2/x", True),
    ("/v[!12]/x", "/v3/x", True),
    ("/v[!12]/x", "/v1/x", False),
    ("/v[!12]/x", "/v//x", False),  # classes never match the separator
    ("/{repos,gists}/**", "/gists/1", True),
    ("/{repos,gists}/**", "/users/1", False),
    ("/a\\*b", "/a*b", True),
    ("/a\\*b", "/axb", False),
    ("/API", "/api", False),  # case-sensitive
    ("/x/*", "/x/", True),
]


@pytest.mark.parametrize(("pattern", "path", "expected"), PATHS)
def test_path_glob(pattern: str, path: str, expected: bool) -> None:
    assert compile_path_glob(pattern).matches(path) is expected


# §2.3 binaries use the path dialect
BINARIES = [
    ("/usr/bin/*", "/usr/bin/node", True),
    ("/usr/bin/*", "/usr/bin/sub/node", False),
    ("/home/*/.local/bin/copilot", "/home/alice/.local/bin/copilot", True),
    (
        "/usr/lib/node_modules/@github/copilot/node_modules/@github/**/copilot",
        "/usr/lib/node_modules/@github/copilot/node_modules/@github/a/b/c/copilot",
        True,
    ),
    ("/**", "/any/absolute/path", True),
    ("/usr/bin/python3*", "/usr/bin/python3.11", True),
]


@pytest.mark.parametrize(("pattern", "path", "expected"), BINARIES)
def test_binary_glob(pattern: str, path: str, expected: bool) -> None:
    assert compile_path_glob(pattern).matches(path) is expected


# §2.4 with D4: delimiter-free value globs
VALUES = [
    ("foo-*", "foo-1.2", True),
    ("v1.*", "v1.2.3", True),
    ("a?c", "a.c", True),
    ("tools/*", "tools/call", True),
    ("*", "", True),
    ("main", "main", True),
    ("main", "Main", False),
    ("{a,b}", "b", True),
]


@pytest.mark.parametrize(("pattern", "value", "expected"), VALUES)
def test_value_glob(pattern: str, value: str, expected: bool) -> None:
    assert compile_value_glob(pattern).matches(value) is expected


@pytest.mark.parametrize("pattern", ["/a/[b", "/a/{b,c", "/a/{b,{c}}", "/a\\", "/[z-a]"])
def test_glob_syntax_errors(pattern: str) -> None:
    with pytest.raises(GlobSyntaxError):
        compile_path_glob(pattern)


# overlap test (§1.11)
HOST_OVERLAP = [
    ("*.example.com", "**.example.com", True),
    ("*.a.com", "x.*.com", True),
    ("api-*.a.com", "*-v1.a.com", True),
    ("api-*.a.com", "web*.a.com", False),
    ("*.example.com", "*.example.org", False),
    ("**.example.com", "*.*.example.com", True),
    ("*.*.example.com", "*.example.com", False),
    ("**.a.example.com", "*.b.example.com", False),
]


@pytest.mark.parametrize(("a", "b", "expected"), HOST_OVERLAP)
def test_host_globs_intersect(a: str, b: str, expected: bool) -> None:
    ga, gb = compile_host_glob(a), compile_host_glob(b)
    assert ga.intersects(gb) is expected
    assert gb.intersects(ga) is expected


PATH_OVERLAP = [
    ("/repos/**", "/gists/**", False),
    ("/repos/**", "/**", True),
    ("/a/*", "/a/b/c", False),
    ("/a/**", "/a/b/c", True),
    ("/a/*.json", "/a/*.yaml", False),
    ("/a/*.json", "/a/x*", True),
    ("/{a,b}/x", "/b/*", True),
]


@pytest.mark.parametrize(("a", "b", "expected"), PATH_OVERLAP)
def test_path_globs_intersect(a: str, b: str, expected: bool) -> None:
    assert path_globs_intersect(a, b) is expected
    assert path_globs_intersect(b, a) is expected
