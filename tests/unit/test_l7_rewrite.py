"""The placeholder rewrite (§3.13), as a table: where tokens are replaced, and when the request is refused."""

from __future__ import annotations

import base64

import pytest

from supervisor.control.credentials import Credentials, Resolution
from supervisor.control.l7.rewrite import CredentialRefusal, redact_path, redact_query, rewrite_request

SECRET = "tok-REAL_0123456789"
PH = "openshell:resolve:env:TOKEN"
CREDS = Credentials.from_mapping({
    "TOKEN": {"secret": SECRET, "hosts": ["api.test/v1/**", "up.test"]},
    "ODD": {"secret": "needs enc%oding&=", "hosts": ["api.test"]},
    "SLASHY": {"secret": "a/b", "hosts": ["api.test"]},
    "CUSTOM": {"secret": "custom-REAL-1", "hosts": ["api.test"], "placeholder": "sk-custom-placeholder"},
    "UNBOUND": {"secret": "unbound-REAL-2"},
}, environ={})  # fmt: skip


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# (path, query, headers) in → (target, headers) out, for a request to api.test:443
REWRITES = [
    ("/v1/x", None, [("Authorization", f"Bearer {PH}")], "/v1/x", [("Authorization", f"Bearer {SECRET}")]),
    ("/v1/x", None, [("X-Key", PH)], "/v1/x", [("X-Key", SECRET)]),
    ("/v1/x", None, [("Cookie", f"a=1; t={PH}; b=2")], "/v1/x", [("Cookie", f"a=1; t={SECRET}; b=2")]),
    (
        "/v1/x",
        None,
        [("Authorization", f"Basic {b64('user:' + PH)}")],
        "/v1/x",
        [("Authorization", f"Basic {b64('user:' + SECRET)}")],
    ),
    (
        "/v1/x",
        None,
        [("Authorization", f"basic  {b64(PH + ':x')}")],
        "/v1/x",
        [("Authorization", f"basic  {b64(SECRET + ':x')}")],
    ),
    (f"/v1/{PH}/y", None, [], f"/v1/{SECRET}/y", []),
    ("/v1/x", f"key={PH}&keep=a+b%20c", [], f"/v1/x?key={SECRET}&keep=a+b%20c", []),
    ("/v1/x", "key=openshell%3Aresolve%3Aenv%3ATOKEN", [], f"/v1/x?key={SECRET}", []),
    ("/v1/x", "k=openshell:resolve:env:ODD", [], "/v1/x?k=needs%20enc%25oding%26%3D", []),
    ("/v1/x", None, [("X", "openshell:resolve:env:ODD")], "/v1/x", [("X", "needs enc%oding&=")]),
    ("/v1/x", None, [("X", "sk-custom-placeholder")], "/v1/x", [("X", "custom-REAL-1")]),
    ("/v1/x", "a=1", [("Accept", "*/*")], "/v1/x?a=1", [("Accept", "*/*")]),  # nothing to do
]


@pytest.mark.parametrize(("path", "query", "headers", "target", "out"), REWRITES)
def test_rewrites(path: str, query: str | None, headers: list[tuple[str, str]], target: str,
                  out: list[tuple[str, str]]) -> None:  # fmt: skip
    result = rewrite_request(CREDS, host="api.test", port=443, path=path, query=query, headers=headers)
    assert result.target == target and result.headers == out


# requests refused before anything is sent: (host, path, query, headers, resolution)
REFUSALS = [
    ("api.test", "/v2/x", None, [("X", PH)], Resolution.ENDPOINT_MISMATCH),  # bound to /v1/** only
    ("evil.test", "/v1/x", None, [("X", PH)], Resolution.ENDPOINT_MISMATCH),
    ("api.test", "/v1/x", None, [("X", "openshell:resolve:env:UNBOUND")], Resolution.ENDPOINT_MISMATCH),
    ("api.test", "/v1/x", None, [("X", "openshell:resolve:env:NOPE")], Resolution.UNAVAILABLE),
    ("api.test", "/v1/x", None, [("X", "ghp-OPENSHELL-RESOLVE-ENV-TOKEN")], Resolution.UNAVAILABLE),
    ("api.test", "/v1/x", None, [("X", "OPENSHELL:RESOLVE:ENV:TOKEN")], Resolution.UNAVAILABLE),  # mangled
    ("api.test", "/v1/x", f"{PH}=1", [], Resolution.UNAVAILABLE),  # query names are not rewritten
    ("api.test", "/v1/x", None, [(PH, "1")], Resolution.UNAVAILABLE),  # nor header names
    ("api.test", "/v1/openshell:resolve:env:SLASHY", None, [], Resolution.UNAVAILABLE),  # '/' in a path secret
    ("api.test", "/v1/x", None, [("X", f"{PH} openshell:resolve:env:NOPE")], Resolution.UNAVAILABLE),
    # one bound and one unbound token: the whole request is refused, the bound one is not sent either
    ("api.test", "/v1/x", None, [("A", PH), ("B", "openshell:resolve:env:UNBOUND")], Resolution.ENDPOINT_MISMATCH),
]


@pytest.mark.parametrize(("host", "path", "query", "headers", "resolution"), REFUSALS)
def test_refusals(host: str, path: str, query: str | None, headers: list[tuple[str, str]],
                  resolution: Resolution) -> None:  # fmt: skip
    with pytest.raises(CredentialRefusal) as caught:
        rewrite_request(CREDS, host=host, port=443, path=path, query=query, headers=headers)
    assert caught.value.resolution is resolution
    assert caught.value.status == (403 if resolution is Resolution.ENDPOINT_MISMATCH else 500)
    for secret in (SECRET, "unbound-REAL-2", "a/b"):
        assert secret not in caught.value.detail


def test_requests_without_an_authority_resolve_nothing() -> None:
    with pytest.raises(CredentialRefusal) as caught:
        rewrite_request(CREDS, host="api.test", port=443, path="/v1/x", query=None, headers=[("X", PH)],
                        credentials_enabled=False)  # fmt: skip
    assert caught.value.resolution is Resolution.ENDPOINT_MISMATCH
    plain = rewrite_request(CREDS, host="api.test", port=443, path="/v1/x", query=None, headers=[("X", "y")],
                            credentials_enabled=False)  # fmt: skip
    assert plain.headers == [("X", "y")]


def test_no_credentials_at_all_still_refuses_markers() -> None:
    with pytest.raises(CredentialRefusal):
        rewrite_request(Credentials.empty(), host="api.test", port=443, path="/", query=None, headers=[("X", PH)])


def test_used_names_and_redaction() -> None:
    result = rewrite_request(CREDS, host="up.test", port=443, path="/", query=None,
                             headers=[("A", PH), ("B", PH)])  # fmt: skip
    assert result.used == ("TOKEN",)
    assert redact_path(CREDS, f"/bot{PH}/x") == "/bot[CREDENTIAL]/x"
    assert redact_query(CREDS, f"a={PH}&b=2") == "a=%5BCREDENTIAL%5D&b=2"
    assert redact_query(CREDS, None) is None
