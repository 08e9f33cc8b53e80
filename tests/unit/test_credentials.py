"""The credential table: loading, validation, placeholders, bindings; secrets never printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.control.credentials import Credentials, CredentialsError, Resolution

SECRET = "sk-live-0123456789abcdef"


def load(data: object, environ: dict[str, str] | None = None) -> Credentials:
    return Credentials.from_mapping(data, environ=environ or {})


def test_yaml_file_with_secret_and_secret_env(tmp_path: Path) -> None:
    path = tmp_path / "creds.yaml"
    path.write_text(
        "GITHUB_TOKEN:\n  secret_env: REAL_GH\n  hosts: [api.github.com, '*.githubusercontent.com:443']\n"
        f"OPENAI_API_KEY:\n  secret: {SECRET}\n  hosts: ['api.openai.com/v1/**']\n  placeholder: sk-placeholder-0000\n"
    )
    creds = Credentials.load(path, environ={"REAL_GH": "ghp_real"})
    assert creds.placeholders() == {
        "GITHUB_TOKEN": "openshell:resolve:env:GITHUB_TOKEN",
        "OPENAI_API_KEY": "sk-placeholder-0000",
    }
    assert SECRET not in repr(creds) and SECRET not in repr(list(creds)) and "ghp_real" not in repr(list(creds))
    assert creds.resolve("openshell:resolve:env:GITHUB_TOKEN", "api.github.com", 443, "/user")[0] is Resolution.RESOLVED


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({"K": {"secret": SECRET, "hosts": [{"host": "a.test", "ports": [443, 8443]}]}}))
    creds = Credentials.load(path)
    assert [b.describe() for c in creds for b in c.bindings] == ["a.test:443,8443"]


def test_no_file_means_no_credentials() -> None:
    creds = Credentials.load(None)
    assert len(creds) == 0 and creds.placeholders() == {}


# binding entry, (host, port, path) -> resolves?
BINDINGS = [
    ("api.test", ("api.test", 443, "/x"), True),
    ("api.test", ("api.test", 8080, "/x"), True),  # no port: any port
    ("API.Test.", ("api.test", 443, "/"), True),
    ("api.test", ("other.test", 443, "/x"), False),
    ("api.test", ("api.test.evil.net", 443, "/x"), False),
    ("api.test:443", ("api.test", 8443, "/x"), False),
    ("*.example.com", ("api.example.com", 443, "/"), True),
    ("*.example.com", ("example.com", 443, "/"), False),
    ("*.example.com", ("a.b.example.com", 443, "/"), False),
    ("**.example.com", ("a.b.example.com", 443, "/"), True),
    ("api.test/v1/**", ("api.test", 443, "/v1"), True),
    ("api.test/v1/**", ("api.test", 443, "/v1/a/b"), True),
    ("api.test/v1/**", ("api.test", 443, "/v2/a"), False),
    ("api.test/v1/**", ("api.test", 443, "/v10"), False),
    ("api.test:443/bot*/send", ("api.test", 443, "/bot[CREDENTIAL]/send"), True),
    ("api.test/a/*/c", ("api.test", 443, "/a/x/y/c"), True),  # binding paths: * crosses /
    ("[2001:db8::1]:443", ("2001:db8::1", 443, "/"), True),
    ("10.0.0.1", ("10.0.0.1", 443, "/"), True),
    ({"host": "api.test", "port": 443, "path": "/x/**"}, ("api.test", 443, "/x/y"), True),
    ({"host": "api.test", "ports": [80]}, ("api.test", 443, "/"), False),
]


@pytest.mark.parametrize(("binding", "where", "resolves"), BINDINGS)
def test_bindings(binding: object, where: tuple[str, int, str], resolves: bool) -> None:
    creds = load({"K": {"secret": SECRET, "hosts": [binding]}})
    outcome, cred = creds.resolve("openshell:resolve:env:K", *where)
    assert outcome is (Resolution.RESOLVED if resolves else Resolution.ENDPOINT_MISMATCH)
    assert cred is not None and cred.name == "K"


def test_only_the_issued_placeholder_resolves() -> None:
    creds = load({"K": {"secret": SECRET, "hosts": ["a.test"], "placeholder": "custom-placeholder-K"}})
    assert creds.resolve("custom-placeholder-K", "a.test", 443, "/")[0] is Resolution.RESOLVED
    for spelling in ("openshell:resolve:env:K", "ghp-OPENSHELL-RESOLVE-ENV-K", "openshell:resolve:env:NOPE"):
        assert creds.resolve(spelling, "a.test", 443, "/")[0] is Resolution.UNAVAILABLE


def test_unbound_credentials_are_never_injected() -> None:
    creds = load({"K": {"secret": SECRET}})
    assert creds.resolve("openshell:resolve:env:K", "a.test", 443, "/")[0] is Resolution.ENDPOINT_MISMATCH
    assert any("never injected" in w for w in creds.warnings)
    assert creds.placeholders() == {"K": "openshell:resolve:env:K"}


def test_missing_secret_env_is_unavailable_not_fatal() -> None:
    creds = load({"K": {"secret_env": "NOT_SET", "hosts": ["a.test"]}})
    assert creds.resolve("openshell:resolve:env:K", "a.test", 443, "/")[0] is Resolution.UNAVAILABLE
    assert any("NOT_SET" in w for w in creds.warnings)


INVALID = [
    ([], "expected a mapping"),
    ({"1BAD": {"secret": SECRET}}, "environment variable names"),
    ({"OPENSHELL_X": {"secret": SECRET}}, "reserved"),
    ({"HTTPS_PROXY": {"secret": SECRET}}, "reserved"),
    ({"SSL_CERT_FILE": {"secret": SECRET}}, "reserved"),
    ({"v1_KEY": {"secret": SECRET}}, "reserved"),
    ({"K": "plain"}, "expected a mapping"),
    ({"K": {"secret": SECRET, "secret_env": "X"}}, "exactly one"),
    ({"K": {"hosts": ["a.test"]}}, "exactly one"),
    ({"K": {"secret": SECRET, "extra": 1}}, "unknown keys"),
    ({"K": {"secret": "has\nnewline"}}, "printable ASCII"),
    ({"K": {"secret": " padded"}}, "printable ASCII"),
    ({"K": {"secret": "nul\x00"}}, "printable ASCII"),
    ({"K": {"secret": "x-openshell:resolve:env:Y"}}, "placeholder markers"),
    ({"K": {"secret": SECRET, "placeholder": "short"}}, "placeholder"),
    ({"K": {"secret": SECRET, "placeholder": "has space in it!!"}}, "placeholder"),
    ({"K": {"secret": SECRET, "hosts": "a.test"}}, "expected a list"),
    ({"K": {"secret": SECRET, "hosts": ["*"]}}, "matches all hosts"),
    ({"K": {"secret": SECRET, "hosts": ["*.com"]}}, "TLD wildcard"),
    ({"K": {"secret": SECRET, "hosts": ["a.test:0"]}}, "port"),
    ({"K": {"secret": SECRET, "hosts": ["a.test:x"]}}, "port"),
    ({"K": {"secret": SECRET, "hosts": ["https://a.test/"]}}, "hosts[0]"),
    ({"K": {"secret": SECRET, "hosts": [{"host": "a.test", "port": 1, "ports": [2]}]}}, "mutually exclusive"),
    ({"K": {"secret": SECRET, "hosts": [{"hostname": "a.test"}]}}, "unknown keys"),
    (
        {
            "A": {"secret": SECRET, "placeholder": "same-placeholder-1"},
            "B": {"secret": "other-secret-1", "placeholder": "same-placeholder-1"},
        },
        "overlap",
    ),
]


@pytest.mark.parametrize(("data", "message"), INVALID)
def test_invalid_files_are_refused_with_the_field_and_never_the_secret(data: object, message: str) -> None:
    with pytest.raises(CredentialsError) as caught:
        load(data)
    assert message in str(caught.value)
    assert SECRET not in str(caught.value) and "has\nnewline" not in str(caught.value)


def test_unparsable_file_does_not_echo_its_text(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"K: {{secret: {SECRET}\n  : [")
    with pytest.raises(CredentialsError) as caught:
        Credentials.load(path)
    assert SECRET not in str(caught.value) and str(path) in str(caught.value)


def test_marker_scan_sees_every_spelling() -> None:
    creds = load({"K": {"secret": SECRET, "hosts": ["a.test"]}})
    for text in ("openshell:resolve:env:K", "OPENSHELL:RESOLVE:ENV:K", "openshell%3Aresolve%3Aenv%3AK",
                 "xyz-OPENSHELL-RESOLVE-ENV-K", "openshell-resolve-env-k"):  # fmt: skip
        assert creds.has_marker(text), text
    assert not creds.has_marker("Bearer abc.def") and not Credentials.empty().has_marker("openshell")


def test_injects_at_tells_which_connections_need_inspection() -> None:
    creds = load({
        "A": {"secret": SECRET, "hosts": ["api.test:443/v1/**", "*.cdn.test"]},
        "B": {"secret_env": "UNSET", "hosts": ["b.test"]},
        "C": {"secret": "other-secret-1"},
    })  # fmt: skip
    assert creds.injects_at("API.test.", 443) and creds.injects_at("x.cdn.test", 8080)
    assert not creds.injects_at("api.test", 80)
    assert not creds.injects_at("b.test", 443)  # no secret: nothing to inject
    assert not creds.injects_at("c.test", 443)  # unbound: never injected
