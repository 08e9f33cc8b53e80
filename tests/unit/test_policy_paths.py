"""Request-target canonicalisation (docs/reference/policy.md §3.8.3) and query parsing (§3.8.4): the spec's examples."""

from __future__ import annotations

import pytest

from supervisor.control.policy import TargetError, canonicalize_target, parse_query

CANONICAL = [
    ("/a/./b", "/a/b"),
    ("/a/../b", "/b"),
    ("/a/b/..", "/a/"),
    ("/a/b/.", "/a/b/"),
    ("/public/%2e%2e/secret", "/secret"),
    ("/public/%2E%2E/secret", "/secret"),
    ("//public//../secret", "/secret"),
    ("/a;jsessionid=x/b", "/a/b"),
    ("/public/..;/secret", "/secret"),
    ("/public/..%3B/secret", "/secret"),
    ("/fetch/http://x.test", "/fetch/http:/x.test"),
    ("http://host/a/../b", "/b"),
    ("https://host", "/"),
    ("", "/"),
    ("/", "/"),
    ("/a/", "/a/"),
    ("/%252F", "/%252F"),
    ("/%40x", "/@x"),
    ("/%c3%a9", "/%C3%A9"),
    ("/a%20b", "/a%20b"),
    ("/~user/!$&'()*+,=:@", "/~user/!$&'()*+,=:@"),
    ('/a"b', "/a%22b"),
]


@pytest.mark.parametrize(("raw", "expected"), CANONICAL)
def test_canonical(raw: str, expected: str) -> None:
    assert canonicalize_target(raw).path == expected


REFUSED = [
    "/..",
    "/a/../..",
    "/public/..;/..;/x",
    "/a/%2f/b",
    "/a/%2F/b",
    "/public/..%2fsecret",
    "/a b",
    "/a\tb",
    "/a\x00b",
    "/a\x7fb",
    "/é",
    "/a#frag",
    "/%zz",
    "/%2",
    "/%00",
    "/%0a",
    "/%7f",
    "relative/path",
    "*",
    "/" + "a" * 4096,
]


@pytest.mark.parametrize("raw", REFUSED)
def test_refused(raw: str) -> None:
    with pytest.raises(TargetError):
        canonicalize_target(raw)


def test_encoded_slash_opt_in() -> None:
    assert canonicalize_target("/a/%2f/b", allow_encoded_slash=True).path == "/a/%2F/b"
    with pytest.raises(TargetError, match="hidden"):
        canonicalize_target("/public/..%2fsecret", allow_encoded_slash=True)
    with pytest.raises(TargetError, match="hidden"):
        canonicalize_target("/x/%2f..%2fy", allow_encoded_slash=True)


def test_query_kept_verbatim() -> None:
    target = canonicalize_target("/a/../b?x=%41&y")
    assert (target.path, target.query, target.target) == ("/b", "x=%41&y", "/b?x=%41&y")
    assert canonicalize_target("/b").query is None
    assert canonicalize_target("/b?").query == ""


QUERIES = [
    ("a=1&a=2", {"a": ["1", "2"]}),
    ("&&a=1&", {"a": ["1"]}),
    ("flag", {"flag": [""]}),
    ("q=a+b", {"q": ["a b"]}),
    ("q=a%2Bb", {"q": ["a+b"]}),
    ("k%20x=v%3Dw", {"k x": ["v=w"]}),
    ("x=a=b", {"x": ["a=b"]}),
    ("u=%E2%9C%93", {"u": ["✓"]}),
    ("", {}),
]


@pytest.mark.parametrize(("query", "expected"), QUERIES)
def test_query(query: str, expected: dict[str, list[str]]) -> None:
    assert parse_query(query) == expected


@pytest.mark.parametrize("query", ["a=%", "a=%g1", "a=%FF", "%C3=1"])
def test_query_refused(query: str) -> None:
    with pytest.raises(TargetError):
        parse_query(query)
