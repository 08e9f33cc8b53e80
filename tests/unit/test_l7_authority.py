"""Authority binding (§3.9): the table of what a request inside a tunnel may name."""

from __future__ import annotations

import pytest

from supervisor.control.l7.authority import (
    AuthorityError,
    AuthoritySource,
    RequestAuthority,
    request_authority,
    same_authority,
)

# (tunnel host, tunnel port, tls, target, Host header, binds?)
CASES = [
    ("api.example.com", 443, True, "/x", "api.example.com", True),
    ("api.example.com", 443, True, "/x", "API.Example.COM.", True),
    ("api.example.com", 443, True, "/x", "api.example.com:443", True),
    ("api.example.com", 8443, True, "/x", "api.example.com", False),  # effective 443 ≠ 8443
    ("api.example.com", 8443, True, "/x", "API.Example.COM.:8443", True),
    ("api.example.com", 443, True, "/x", "evil.example.com", False),
    ("api.example.com", 443, True, "/x", "api.example.com.evil.net", False),
    ("api.example.com", 443, True, "https://api.example.com/x", "api.example.com", True),
    ("api.example.com", 443, True, "http://api.example.com/x", "api.example.com:80", False),  # http ⇒ 80
    ("api.example.com", 443, True, "https://evil.example.com/x", "evil.example.com", False),
    ("api.example.com", 443, True, "https://api.example.com/x", None, True),
    ("api.example.com", 80, False, "/x", "api.example.com", True),
    ("api.example.com", 80, False, "/x", "api.example.com:80", True),
    ("api.example.com", 443, False, "/x", "api.example.com", False),  # plaintext default is 80
    ("2001:db8::1", 443, True, "/x", "[2001:DB8:0::1]", True),
    ("2001:db8::1", 443, True, "/x", "[2001:db8::2]", False),
    ("10.0.0.1", 443, True, "/x", "10.0.0.1:443", True),
    ("bücher.example", 443, True, "/x", "xn--bcher-kva.example", True),
    ("api.example.com", 443, True, "/x", None, True),  # HTTP/1.0 without Host: no authority, no credentials
]


@pytest.mark.parametrize(("host", "port", "tls", "target", "header", "binds"), CASES)
def test_binding(host: str, port: int, tls: bool, target: str, header: str | None, binds: bool) -> None:
    authority = request_authority(target, header, tls=tls)
    assert same_authority(authority, host, port) is binds


MALFORMED = [
    ("https://api.example.com/x", "other.example.com"),  # absolute-form and Host disagree
    ("https://api.example.com/x", "api.example.com:8443"),
    ("ftp://api.example.com/x", "api.example.com"),
    ("https://user@api.example.com/x", "api.example.com"),
    ("/x", "api.example.com:0443"),
    ("/x", "api.example.com:99999"),
    ("/x", "api example.com"),
    ("/x", "api.example.com:"),
    ("/x", "[::1"),
    ("/x", "a..b"),
    ("/x", ""),
]


@pytest.mark.parametrize(("target", "header"), MALFORMED)
def test_malformed_authorities(target: str, header: str) -> None:
    with pytest.raises(AuthorityError):
        request_authority(target, header, tls=True)


def test_sources() -> None:
    assert request_authority("/x", "a.test", tls=True).source is AuthoritySource.HOST
    assert request_authority("https://a.test/x", "a.test", tls=True).source is AuthoritySource.ABSOLUTE
    assert request_authority("/x", None, tls=True).source is AuthoritySource.NONE
    # an origin-form path that merely contains :// is not absolute-form
    assert request_authority("/fetch/http://evil.test/", "a.test", tls=True).host == "a.test"


# --- edges the mutation run asked for (docs/design.md "Testing") -------------------------------------------------

ABSOLUTE = [
    ("https://api.example.com", ("api.example.com", 443)),  # no path at all
    ("https://api.example.com/a/b/c", ("api.example.com", 443)),  # the authority ends at the first slash
    ("https://api.example.com?a=1?b=2/c", ("api.example.com", 443)),  # ... or the first question mark
    ("http://api.example.com:8080?q", ("api.example.com", 8080)),
    ("HTTPS://API.example.com./x", ("api.example.com", 443)),
]


@pytest.mark.parametrize(("target", "authority"), ABSOLUTE)
def test_the_authority_of_an_absolute_target_ends_where_its_path_or_query_starts(
    target: str, authority: tuple[str, int]
) -> None:
    got = request_authority(target, None, tls=True)
    assert (got.host, got.port, got.source) == (*authority, AuthoritySource.ABSOLUTE)


REASONS = [
    ("https:///x", "api.example.com", "authority does not parse: authority must be non-empty ASCII"),
    ("https://?x", None, "authority does not parse: authority must be non-empty ASCII"),
    ("/x", "api example.com", "authority does not parse: invalid host: 'api example.com'"),
    ("/x", "a..b", "authority names an invalid host"),
    ("ftp://api.example.com/x", None, "absolute-form target with scheme 'ftp'"),
    ("https://a.test/x", "b.test", "absolute-form target and Host header name different authorities"),
]


@pytest.mark.parametrize(("target", "header", "reason"), REASONS)
def test_each_malformed_authority_says_why(target: str, header: str | None, reason: str) -> None:
    with pytest.raises(AuthorityError) as info:
        request_authority(target, header, tls=True)
    assert str(info.value) == reason


def test_no_host_is_the_empty_authority() -> None:
    assert request_authority("/x", None, tls=False) == RequestAuthority("", 0, AuthoritySource.NONE)
