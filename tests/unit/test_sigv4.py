"""The SigV4 signer against the AWS Signature Version 4 test suite (tests/unit/aws4_testsuite, from botocore's sdist).

Each case's ``.req`` is signed with the suite's key and every stage is compared: the canonical request
(``.creq``), the string to sign (``.sts``) and the ``Authorization`` value (``.authz``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from supervisor.control.l7 import sigv4

SUITE = Path(__file__).parent / "aws4_testsuite"
KEY_ID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
# the suite's one case whose .authz is not the signature of its .creq (it repeats get-vanilla's)
BROKEN_AUTHZ = {"get-vanilla-with-session-token"}


def _cases() -> list[Path]:
    return sorted(p.parent for p in SUITE.rglob("*.creq"))


def _parse(req: str) -> tuple[str, str, str | None, list[tuple[str, str]], bytes]:
    head, _sep, body = req.partition("\n\n")
    lines = head.split("\n")
    method, _sp, rest = lines[0].partition(" ")
    target = rest.rpartition(" ")[0]  # a target may hold spaces (get-space); the version is the last word
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and headers:  # an obsolete folded line continues the previous value
            name, value = headers[-1]
            headers[-1] = (name, value + " " + line.strip())
            continue
        name, _colon, value = line.partition(":")
        headers.append((name, value))
    path, _q, query = target.partition("?")
    return method, path, (query if _q else None), headers, body.encode("utf-8")


@pytest.mark.parametrize("case", _cases(), ids=lambda p: p.relative_to(SUITE).as_posix())
def test_aws_suite_vector(case: Path) -> None:
    name = case.name
    method, path, query, headers, body = _parse((case / f"{name}.req").read_text(encoding="utf-8"))
    creq_expected = (case / f"{name}.creq").read_text(encoding="utf-8")
    signed_names = creq_expected.split("\n")[-2].split(";")
    if "x-amz-security-token" in signed_names and not any(n.lower() == "x-amz-security-token" for n, _ in headers):
        sreq = (case / f"{name}.sreq").read_text(encoding="utf-8")
        token = next(line.split(":", 1)[1] for line in sreq.split("\n") if line.startswith("X-Amz-Security-Token:"))
        headers.append(("X-Amz-Security-Token", token))
    amz_date = next(v for n, v in headers if n.lower() == "x-amz-date")

    signed = sigv4.sign(
        method=method, path=path, query=query, headers=headers, signed=signed_names,
        payload_hash=hashlib.sha256(body).hexdigest(), access_key_id=KEY_ID, secret_key=SECRET,
        region="us-east-1", service="service", amz_date=amz_date,
    )  # fmt: skip
    assert signed.canonical_request == creq_expected
    assert signed.string_to_sign == (case / f"{name}.sts").read_text(encoding="utf-8")
    if name not in BROKEN_AUTHZ:
        assert signed.authorization == (case / f"{name}.authz").read_text(encoding="utf-8")


def test_every_vector_is_found() -> None:
    assert len(_cases()) >= 30


def test_s3_signs_the_path_as_sent() -> None:
    assert sigv4.canonical_uri("/my-object//example//photo.user", normalize=False) == (
        "/my-object//example//photo.user"
    )
    assert sigv4.canonical_uri("/a%20b", normalize=False) == "/a%20b"
    assert sigv4.canonical_uri("/a%20b", normalize=True) == "/a%2520b"  # every other service: encoded twice


def test_query_is_decoded_then_encoded_and_plus_stays_a_plus() -> None:
    assert sigv4.canonical_query("b=2&a=%7e&a=1&c") == "a=1&a=~&b=2&c="
    assert sigv4.canonical_query("k=a+b") == "k=a%2Bb"
    assert sigv4.canonical_query("list-type=2&prefix=") == "list-type=2&prefix="


def test_key_id_is_read_from_an_authorization_value() -> None:
    value = (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=5fa0"
    )
    assert sigv4.authorization_key_id(value) == "AKIDEXAMPLE"
    assert sigv4.authorization_key_id("Bearer x") is None
    assert sigv4.authorization_key_id("AWS4-HMAC-SHA256 SignedHeaders=host") is None


def test_a_signed_header_missing_from_the_request_is_an_error() -> None:
    with pytest.raises(ValueError, match="x-amz-date"):
        sigv4.canonical_request("GET", "/", None, [("Host", "h")], ["host", "x-amz-date"], sigv4.EMPTY_SHA256)
