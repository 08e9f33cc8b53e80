"""Access key pairs in the credentials file (supervisor/control/credentials.py rule 7): placeholders, binding, the
choice by key id, scrubbing of all three values, and never being placed in a request."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli.dev_common import secret_env_names
from supervisor.control.credentials import Credentials, CredentialsError, Resolution
from supervisor.control.l7.rewrite import CredentialRefusal, rewrite_request

KEY_ID = "AKIAREALKEYID0000001"
SECRET = "real/secret+key0000000000000000000000001"
TOKEN = "FwoGZXIvYXdzEreal-session-token"


def pair(**extra: object) -> Credentials:
    entry: dict[str, object] = {"access_key_id": KEY_ID, "secret_access_key_env": "REAL_AWS", "hosts": ["s3.test:443"]}
    entry.update(extra)
    return Credentials.from_mapping({"AWS": entry}, environ={"REAL_AWS": SECRET})


def test_the_agent_gets_three_placeholders_named_like_the_sdk_variables() -> None:
    creds = pair(session_token=TOKEN)
    assert creds.placeholders() == {
        "AWS_ACCESS_KEY_ID": "openshell:resolve:env:AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY": "openshell:resolve:env:AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN": "openshell:resolve:env:AWS_SESSION_TOKEN",
    }
    assert "AWS_SESSION_TOKEN" not in pair().placeholders()
    shown = repr(creds) + repr(list(creds))
    assert KEY_ID not in shown and SECRET not in shown and TOKEN not in shown


def test_the_pair_is_chosen_by_the_key_id_placeholder_and_its_binding() -> None:
    creds = pair()
    resolution, cred = creds.key_pair_for("openshell:resolve:env:AWS_ACCESS_KEY_ID", "s3.test", 443, "/b/k")
    assert resolution is Resolution.RESOLVED and cred is not None and cred.key_pair is not None
    assert cred.key_pair.access_key_id == KEY_ID and cred.secret == SECRET
    assert creds.key_pair_for("openshell:resolve:env:AWS_ACCESS_KEY_ID", "other.test", 443, "/")[0] is (
        Resolution.ENDPOINT_MISMATCH
    )
    assert creds.key_pair_for("AKIDSOMEOTHERKEY", "s3.test", 443, "/")[0] is Resolution.ENDPOINT_MISMATCH
    # the secret key's placeholder is no key id
    assert creds.key_pair_for("openshell:resolve:env:AWS_SECRET_ACCESS_KEY", "s3.test", 443, "/")[1] is None


def test_a_pair_whose_secret_is_unset_is_unavailable() -> None:
    creds = Credentials.from_mapping(
        {"AWS": {"access_key_id": KEY_ID, "secret_access_key_env": "UNSET", "hosts": ["s3.test"]}}, environ={}
    )
    assert creds.key_pair_for("openshell:resolve:env:AWS_ACCESS_KEY_ID", "s3.test", 443, "/")[0] is (
        Resolution.UNAVAILABLE
    )
    assert any("UNSET" in w for w in creds.warnings)
    assert not creds.injects_at("s3.test", 443)


def test_every_value_of_the_pair_is_scrubbed_from_its_hosts() -> None:
    scrubbed = dict(pair(session_token=TOKEN).secrets_at("s3.test", 443))
    assert scrubbed == {
        SECRET: "openshell:resolve:env:AWS_SECRET_ACCESS_KEY",
        KEY_ID: "openshell:resolve:env:AWS_ACCESS_KEY_ID",
        TOKEN: "openshell:resolve:env:AWS_SESSION_TOKEN",
    }
    assert pair().secrets_at("other.test", 443) == []


@pytest.mark.parametrize("placeholder", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"])
def test_a_pair_is_never_placed_in_a_request(placeholder: str) -> None:
    """The agent asks for the raw secret key in a header on the very host the pair is bound to: refused."""
    creds = pair(session_token=TOKEN)
    with pytest.raises(CredentialRefusal) as caught:
        rewrite_request(creds, host="s3.test", port=443, path="/", query=None,
                        headers=[("X-Leak", f"openshell:resolve:env:{placeholder}")])  # fmt: skip
    assert caught.value.status == 500 and "access key pair" in caught.value.detail
    assert SECRET not in caught.value.detail


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"secret_access_key": SECRET, "hosts": ["s3.test"]}, "missing access_key_id"),
        ({"access_key_id": KEY_ID, "hosts": ["s3.test"]}, "missing secret_access_key"),
        ({"access_key_id": KEY_ID, "access_key_id_env": "X", "secret_access_key": SECRET}, "mutually exclusive"),
        ({"access_key_id": KEY_ID, "secret_access_key": SECRET, "secret": "x"}, "unknown keys"),
        ({"access_key_id": KEY_ID, "secret_access_key": " padded"}, "printable ASCII"),
        ({"access_key_id": KEY_ID, "secret_access_key": "openshell:resolve:env:X"}, "placeholder markers"),
    ],
)
def test_malformed_pairs_are_refused_without_echoing_values(entry: dict[str, object], message: str) -> None:
    with pytest.raises(CredentialsError, match=message) as caught:
        Credentials.from_mapping({"AWS": entry}, environ={})
    assert SECRET not in str(caught.value)


def test_a_pair_and_a_plain_credential_may_not_claim_the_same_variable() -> None:
    with pytest.raises(CredentialsError, match="same environment variable"):
        Credentials.from_mapping({
            "AWS": {"access_key_id": KEY_ID, "secret_access_key": SECRET, "hosts": ["s3.test"]},
            "AWS_ACCESS_KEY_ID": {"secret": "other-secret-value", "hosts": ["s3.test"]},
        }, environ={})  # fmt: skip


def test_dev_mode_passes_control_the_variables_a_key_pair_names(tmp_path: Path) -> None:
    path = tmp_path / "creds.yaml"
    path.write_text("AWS:\n  access_key_id_env: REAL_ID\n  secret_access_key_env: REAL_SECRET\n"
                    "  session_token_env: REAL_TOKEN\n  hosts: [s3.test]\nGH:\n  secret_env: REAL_GH\n")  # fmt: skip
    assert sorted(secret_env_names(path)) == ["REAL_GH", "REAL_ID", "REAL_SECRET", "REAL_TOKEN"]
