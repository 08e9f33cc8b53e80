"""Glob semantics of docs/reference/policy.md §2, one table per dialect, plus the overlap test used by §1.11."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from supervisor.control.policy import globs
from supervisor.control.policy.globs import (
    CharSet,
    GlobSyntaxError,
    Tok,
    compile_host_glob,
    compile_path_glob,
    compile_value_glob,
    has_glob_chars,
    host_pattern_matches,
    parse_path,
    path_globs_intersect,
    runs_intersect,
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


# --- function by function (mutation testing: mutate/run.py "globs") -----------------------------------------


@pytest.fixture(autouse=True)
def _cold_caches() -> Iterator[None]:
    """Each test compiles afresh: mutmut forks every mutant from a process that already ran these tests, and a
    glob compiled there (the compilers are cached) would hide the mutant."""
    cached = (globs.compile_path_glob, globs.compile_value_glob, globs._lit, globs._lit_piece, globs._tok_regex)
    for function in cached:
        function.cache_clear()
    yield
    for function in cached:
        function.cache_clear()


def _set(chars: str, *, negated: bool = False) -> CharSet:
    return CharSet(negated, frozenset(chars))


# (a, b, whether some character is in both)
CHARSET_COMMON = [
    (_set("a", negated=True), _set("b", negated=True), True),
    (_set("", negated=True), _set("", negated=True), True),
    (_set("ab", negated=True), _set("ab"), False),
    (_set("a", negated=True), _set("ab"), True),
    (_set("ab"), _set("a", negated=True), True),
    (_set("ab"), _set("ab", negated=True), False),
    (_set("ab"), _set("bc"), True),
    (_set("ab"), _set("cd"), False),
]


@pytest.mark.parametrize(("a", "b", "expected"), CHARSET_COMMON)
def test_charset_has_common(a: CharSet, b: CharSet, expected: bool) -> None:
    assert a.has_common(b) is expected


CHARSET_REGEX = [
    (_set("a"), "a"),
    (_set("."), "\\."),
    (_set("ab"), "[ab]"),
    (_set("]^-[\\a"), "[\\-\\[\\\\\\]\\^a]"),
    (_set("", negated=True), "."),
    (_set("/", negated=True), "[^/]"),
    (_set("/]", negated=True), "[^/\\]]"),
    (_set("^-", negated=True), "[^\\-\\^]"),
]


@pytest.mark.parametrize(("cs", "expected"), CHARSET_REGEX)
def test_charset_regex(cs: CharSet, expected: str) -> None:
    assert cs.regex() == expected
    assert Tok(False, cs).regex() == expected
    assert Tok(True, cs).regex() == expected + "*"


def test_has_glob_chars() -> None:
    assert [has_glob_chars(p) for p in ("a*", "a?", "a[b]", "{a,b}", "abc", "a\\b", "", "a]b}")] == [
        True, True, True, True, False, False, False, False,
    ]  # fmt: skip


# the expression each compiler makes (pattern → regex; None: compared by equality)
PATH_REGEX = [
    ("/a*", "/a[^/]*"),
    ("/a**", "/a[^/]*"),
    ("/a?", "/a[^/]"),
    ("/v[12]/x", "/v[12]/x"),
    ("/v[!12]/x", "/v[^/12]/x"),
    ("/v[^12]/x", "/v[^/12]/x"),
    ("/{a,b}/x", "/(?:a|b)/x"),
    ("/{ab,c}", "/(?:ab|c)"),
    ("/{a*,b}", "/(?:a[^/]*|b)"),
    ("/{a\\,b,c}", "/(?:a,b|c)"),
    ("/{[,]x,y}", "/(?:,x|y)"),
    ("/{[,}]x,y}", "/(?:[,}]x|y)"),
    ("/{a\\}b,c}", "/(?:a\\}b|c)"),
    ("**", ".*"),
    ("**/x", "(?:|/|.*/)x"),
    ("**/", "(?:|/|.*/)"),
    ("/a/**", "/a/.*"),
    ("/a/**/", "/a(?:/|/.*/)"),
    ("/a/**/b", "/a(?:/|/.*/)b"),
    ("/a/**/**/b", "/a(?:/|/.*/)(?:/|/.*/)b"),
    ("/a/**b", "/a/[^/]*b"),
    ("/a\\*b", "/a\\*b"),
    ("/a\\[b", "/a\\[b"),
    ("/[]a]", "/[\\]a]"),
    ("/[\\]]", "/\\]"),
    ("/[\\]a]", "/[\\]a]"),
    ("/[a-c]", "/[abc]"),
    ("/[a-c-e]", "/[\\-abce]"),
    ("/[a-]", "/[\\-a]"),
    ("/[-a]", "/[\\-a]"),
    ("/[a-\\c]", "/[abc]"),
    ("/[\\a-c]", "/[abc]"),
    ("/[a\\-c]", "/[\\-ac]"),
    ("/[!]]", "/[^/\\]]"),
    ("/[!a-c]", "/[^/abc]"),
    ("/[a/]", "/a"),
    ("/[!/]", "/[^/]"),
    ("/[X]", "/X"),
    ("/[a-\\c-e]", "/[\\-abce]"),
    ("/{[a],[b]}", "/(?:a|b)"),
    ("/{[]a],b}", "/(?:[\\]a]|b)"),
    ("/]{[a],b}", "/\\](?:a|b)"),
    ("/x", None),
    ("/x/y.json", None),
]


@pytest.mark.parametrize(("pattern", "expected"), PATH_REGEX)
def test_path_glob_regex(pattern: str, expected: str | None) -> None:
    glob = compile_path_glob(pattern)
    assert glob.pattern == pattern
    assert (None if glob.regex is None else glob.regex.pattern) == expected


VALUE_REGEX = [
    ("a*", "a.*"),
    ("a?", "a."),
    ("[/]", "/"),
    ("[./]", "[./]"),
    ("[!x]", "[^x]"),
    ("{a,b}", "(?:a|b)"),
    ("a\\*", "a\\*"),
    ("a.b", None),
]


@pytest.mark.parametrize(("pattern", "expected"), VALUE_REGEX)
def test_value_glob_regex(pattern: str, expected: str | None) -> None:
    glob = compile_value_glob(pattern)
    assert (None if glob.regex is None else glob.regex.pattern) == expected


def test_value_glob_crosses_every_separator() -> None:
    assert compile_value_glob("a*z").matches("a/.\nz")
    assert compile_value_glob("a?z").matches("a\nz")
    assert not compile_value_glob("a?z").matches("az")


CLASS_ERRORS = [
    "/[",
    "/[\\",
    "/[\\]",
    "/[a-",
    "/[a-\\",
    "/[a",
    "/[!",
    "/[]",
    "/[!]",
    "/[z-a]",
    "/[b-a]",
    "/[/]",
    "/[\\/]",
    "/{[a,b}",
    "/{a,b",
    "/{a,{b,c}}",
    "/a\\",
    "/{a\\}",
    "/[" + chr(0x20) + "-" + chr(0x20 + globs.MAX_CLASS_RANGE + 1) + "]",
]


@pytest.mark.parametrize("pattern", CLASS_ERRORS)
def test_path_glob_refused(pattern: str) -> None:
    with pytest.raises(GlobSyntaxError) as raised:
        compile_path_glob(pattern)
    assert str(raised.value)


def test_class_range_limit_is_inclusive() -> None:
    top = chr(0x20 + globs.MAX_CLASS_RANGE)
    glob = compile_path_glob("/[ -" + top + "]")
    assert glob.matches("/" + top) and glob.matches("/ ") and not glob.matches("/" + chr(ord(top) + 1))
    assert compile_path_glob("/[a-a]").matches("/a")


def test_error_messages() -> None:
    for pattern, words in [
        ("/[a", "unbalanced '[' at offset 1"),
        ("/[z-a]", "reversed range 'z-a'"),
        ("/[/]", "can only match the separator '/'"),
        ("/{a,b", "unbalanced '{' at offset 1"),
        ("/{[a,b}", "unbalanced '[' at offset 2"),
        ("/{a,{b}}", "nested '{' at offset 4"),
        ("/[z-a", "reversed range 'z-a'"),
        ("/[a-\\c", "unbalanced '[' at offset 1"),
        ("/{a\\}", "unbalanced '{' at offset 1"),
    ]:
        with pytest.raises(GlobSyntaxError, match=re.escape(words)):
            compile_path_glob(pattern)
    with pytest.raises(GlobSyntaxError) as raised:
        compile_path_glob("/a\\")
    assert str(raised.value) == "trailing backslash"
    with pytest.raises(GlobSyntaxError, match="too large"):
        compile_path_glob("/[\x00-\U0010ffff]")
    with pytest.raises(GlobSyntaxError, match=re.escape("separator '.'")):
        globs._parse_simple("a[.]", "label", braces=False)  # a host label's class (hosts.py never passes one)
    assert globs._parse_simple("a[!.]", "label", braces=False)[1] == ((Tok(False, CharSet(True, frozenset("."))),),)


PATH_MATCHES_MORE = [
    ("**/x", "x", True),
    ("**/x", "/x", True),
    ("**/x", "a/x", True),
    ("**/x", "//x", True),
    ("**/", "", True),
    ("/a/**/b", "/a/b", True),
    ("/a/**/b", "/a/x/y/b", True),
    ("/a/**/b", "/ab", False),
    ("/a/**/", "/a/x/", True),
    ("/a/**/", "/a/", True),
    ("/a/**", "/a/\n", True),
    ("**", "\n", True),
    ("/[a-\\c]", "/b", True),
    ("/[a-\\c]", "/\\", False),
    ("/[\\]a]", "/]", True),
    ("/[]a]", "/a", True),
    ("/[!]]", "/]", False),
    ("/[!]]", "/x", True),
    ("/{a*,b}/x", "/abc/x", True),
    ("/{a\\,b,c}", "/a,b", True),
]


@pytest.mark.parametrize(("pattern", "path", "expected"), PATH_MATCHES_MORE)
def test_path_glob_more(pattern: str, path: str, expected: bool) -> None:
    assert compile_path_glob(pattern).matches(path) is expected


def test_parse_path_pieces() -> None:
    slash = Tok(False, CharSet(False, frozenset("/")))
    any_run = Tok(True, globs.ANY)
    assert parse_path("**") == [((any_run,),)]
    assert parse_path("**/") == [((), (slash,), (any_run, slash))]
    assert parse_path("/**") == [((slash, any_run),)]
    assert parse_path("/**/") == [((slash,), (slash, any_run, slash))]
    assert parse_path("/?") == [((slash,),), ((Tok(False, globs.NOT_SLASH),),)]
    assert parse_path("/[a]") == [((slash,),), ((Tok(False, CharSet(False, frozenset("a"))),),)]


# (a, b, whether some path matches both)
PATH_OVERLAP_MORE = [
    ("/a/**/b", "/a/b", True),
    ("/a/**/b", "/a/c", False),
    ("**/b", "/x/y/b", True),
    ("**/b", "b", True),
    ("/a?", "/ab", True),
    ("/a?", "/a/", False),
    ("/a[bc]", "/ac", True),
    ("/a[bc]", "/ad", False),
    ("/a[!bc]", "/ab", False),
    ("/a[!bc]", "/a[!bd]", True),
    ("/a[!b]", "/a[b]", False),
    ("/a*b*c", "/a*c", True),
    ("/*a*", "/*b*", True),
    ("/*a", "/*b", False),
    ("/x*", "/y*", False),
    ("/a*", "/a", True),
    ("/ab*", "/a", False),
    ("*a", "b*", True),
    ("/{a,b}{c,d}", "/bd", True),
    ("/{a,b}{c,d}", "/bb", False),
]


@pytest.mark.parametrize(("a", "b", "expected"), PATH_OVERLAP_MORE)
def test_path_globs_intersect_more(a: str, b: str, expected: bool) -> None:
    assert path_globs_intersect(a, b) is expected
    assert path_globs_intersect(b, a) is expected


def test_too_many_alternatives_are_assumed_to_overlap() -> None:
    eight = "{a,b,c,d,e,f,g,h}"
    assert not path_globs_intersect(f"/{eight}/{eight}", "/q")  # 64 alternatives: still proved apart
    assert path_globs_intersect(f"/{eight}/{eight}{{x,y}}", "/q")  # 128: assumed to overlap
    assert path_globs_intersect("/q", f"/{eight}/{eight}{{x,y}}")
    assert not path_globs_intersect(f"/{eight}", "/{p,q}/x")


def test_runs_intersect_revisits_without_giving_up() -> None:
    """Two stars on each side reach the same pair of positions along several routes; every one is explored."""
    a = [t for p in parse_path("/*x*y") for t in p[0]]
    b = [t for p in parse_path("/*y*x*y") for t in p[0]]
    assert runs_intersect(tuple(a), tuple(b))
    assert path_globs_intersect("/aa", "/*a*a")
    assert path_globs_intersect("/aba", "/*a*a")
    assert path_globs_intersect("/*a*b*c", "/*c*b*a*c")
    assert not path_globs_intersect("/*a*b*c", "/*c*b*a")


HOST_COMPILED = [
    # pattern, regex, labels, recursive, literal suffix, suffix decides
    ("*.a.com", "[^.][^.]*\\.a\\.com", 3, False, ("a", "com"), True),
    ("**.a.com", "(?:[^.]+\\.)+a\\.com", 3, True, ("a", "com"), True),
    ("**.*.a.com", "(?:[^.]+\\.)+[^.][^.]*\\.a\\.com", 4, True, ("a", "com"), True),
    ("*.*.a.com", "[^.][^.]*\\.[^.][^.]*\\.a\\.com", 4, False, ("a", "com"), True),
    ("api?.*.a.com", "api[^.]\\.[^.][^.]*\\.a\\.com", 4, False, ("a", "com"), False),
    ("a[0-2].b.com", "a[012]\\.b\\.com", 3, False, ("b", "com"), False),
    ("*-x.a.com", "[^.]*\\-x\\.a\\.com", 3, False, ("a", "com"), False),
    ("*.s3.*.a.com", "[^.][^.]*\\.s3\\.[^.][^.]*\\.a\\.com", 5, False, ("a", "com"), False),
    ("a.*", "a\\.[^.][^.]*", 2, False, (), False),
    ("x{a,b}.com", "x\\{a,b\\}\\.com", 2, False, ("com",), False),
]


@pytest.mark.parametrize(("pattern", "regex", "labels", "recursive", "suffix", "decides"), HOST_COMPILED)
def test_host_glob_compiled(
    pattern: str, regex: str, labels: int, recursive: bool, suffix: tuple[str, ...], decides: bool
) -> None:
    glob = compile_host_glob(pattern)
    assert (glob.pattern, glob.regex.pattern, glob.labels) == (pattern, regex, labels)
    assert (glob.recursive, glob.literal_suffix, glob.suffix_decides) == (recursive, suffix, decides)
    assert glob.regex.flags & re.S
    assert len(glob.label_pieces) == labels - (1 if recursive else 0)


def test_host_glob_whole_star_label_is_never_empty() -> None:
    glob = compile_host_glob("*.a.com")
    assert glob.label_pieces[0] == (((Tok(False, globs.NOT_DOT),),), ((Tok(True, globs.NOT_DOT),),))
    assert not glob.matches(".a.com")
    assert compile_host_glob("x*.a.com").matches("x.a.com")


HOST_OVERLAP_MORE = [
    ("**.b.com", "b.com", False),
    ("**.b.com", "x.b.com", True),
    ("**.com", "b.com", True),
    ("**.b.com", "**.b.com", True),
    ("**.x.b.com", "**.b.com", True),
    ("**.x.b.com", "**.y.b.com", False),
    ("**.x.b.com", "y.b.com", False),
    ("*.b.com", "*.c.b.com", False),
    ("*.a.com", ".a.com", False),
]


@pytest.mark.parametrize(("a", "b", "expected"), HOST_OVERLAP_MORE)
def test_host_globs_intersect_more(a: str, b: str, expected: bool) -> None:
    ga, gb = compile_host_glob(a), compile_host_glob(b)
    assert ga.intersects(gb) is expected
    assert gb.intersects(ga) is expected


def test_host_pattern_matches_with_a_star() -> None:
    assert host_pattern_matches("*.a.com", "x.a.com")
    assert not host_pattern_matches("*.a.com", "a.com")
    assert host_pattern_matches("**.a.com", "x.y.a.com")
