"""Policy hosts (supervisor/control/policy/hosts.py): what a request's host normalises to, and what a policy's
``host`` may be, with the exact reason ``policy check`` gives for each refusal."""

from __future__ import annotations

import pytest

from supervisor.control.policy.hosts import normalize_request_host, validate_policy_host

NAME_253 = ".".join(["a" * 63] * 3 + ["b" * 61])

NORMALISED = [
    ("API.Example.COM.", "api.example.com"),
    ("a.bücher.example", "a.xn--bcher-kva.example"),  # every label after an ASCII one is still converted
    ("Bücher.Example", "xn--bcher-kva.example"),
    ("[2001:DB8::1]", "2001:db8::1"),
    ("[::1", None),  # half a bracket is no literal
    ("::1]", None),
    ("[fe80::1%eth0]", None),
    (NAME_253, NAME_253),
    (NAME_253 + "c", None),
    ("a..b", None),
]


@pytest.mark.parametrize(("host", "normalised"), NORMALISED)
def test_normalize_request_host(host: str, normalised: str | None) -> None:
    assert len(NAME_253) == 253
    assert normalize_request_host(host) == normalised


VALIDATED: list[tuple[str, bool, tuple[str, str | None]]] = [
    (" a.example.com", False, (" a.example.com", "host must not contain whitespace")),
    ("a\x01b.example.com", False, ("a\x01b.example.com", "host must not contain control characters")),
    ("a\x7fb.example.com", False, ("a\x7fb.example.com", "host must not contain control characters")),
    ("user@example.com", False, ("user@example.com",
                                  "host must be a DNS name, an IP address or a host glob, not a URL")),
    ("example.com/x", False, ("example.com/x", "host must be a DNS name, an IP address or a host glob, not a URL")),
    ("example.com.", True, ("example.com.", "invalid DNS host selector: trailing dot (protocol tcp)")),
    ("example.com.", False, ("example.com", None)),
    ("::1", False, ("::1", None)),
    ("[::1]", False, ("::1", None)),
    ("[1::]", False, ("1::", None)),
    ("[::1", False, ("[::1", "host is not a valid IPv6 literal")),
    ("example.com:443", False, ("example.com:443", "host must not include a port; use port or ports")),
    ("[::1]", True, ("[::1]", "protocol tcp must use a DNS hostname, not an IP literal")),
    ("10.0.0.1", True, ("10.0.0.1", "protocol tcp must use a DNS hostname, not an IP literal")),
    ("10.0.0.1", False, ("10.0.0.1", None)),
    ("exa mple.com", False, ("exa mple.com", "host must not contain whitespace")),
    ("exa!mple.com", False, ("exa!mple.com", "invalid host name")),
    ("*.Example.com.", False, ("*.example.com", None)),
    ("*..example.com", False, ("*..example.com", "host glob has an empty label")),
    ("*", False, ("*", "host '*' matches all hosts")),
    ("[abc]", False, ("[abc]", "host is not a valid IPv6 literal")),
    ("X1.2.3.4", True, ("x1.2.3.4", None)),  # a name whose labels look numeric, not an IP literal
    ("a.**.example.com", False, ("a.**.example.com",
                                  "recursive host wildcard '**' is only allowed as the entire first DNS label")),
    ("a.b*.example.com", False, ("a.b*.example.com", "middle DNS label wildcard must be the entire label '*'")),
    ("a%*.example.com", False, ("a%*.example.com", "invalid characters in host glob label 'a%*'")),
    ("*[ab].example.com", False, ("*[ab].example.com", None)),
    ("*[ab.example.com", False, ("*[ab.example.com", "unbalanced '[' in host glob label '*[ab'")),
    ("**.*.com", False, ("**.*.com", "TLD wildcard '**.*.com' is not allowed")),
    ("*.com", False, ("*.com", "TLD wildcard '*.com' is not allowed (a host glob needs three or more labels: "
                               "*.example.com)")),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "tcp", "result"), VALIDATED)
def test_validate_policy_host(raw: str, tcp: bool, result: tuple[str, str | None]) -> None:
    assert validate_policy_host(raw, tcp=tcp) == result
