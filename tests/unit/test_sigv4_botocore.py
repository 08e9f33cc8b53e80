"""Our signer agrees with botocore's (a test dependency only) on the requests an SDK makes: S3 object keys with
characters that need encoding, list queries, session tokens, and a non-S3 service's normalised path. botocore signs;
we re-sign what it sent with the same date and header set and must produce the same ``Authorization``."""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit

import pytest

from supervisor.control.l7 import sigv4

botocore_auth = pytest.importorskip("botocore.auth")
botocore_awsrequest = pytest.importorskip("botocore.awsrequest")
botocore_credentials = pytest.importorskip("botocore.credentials")

KEY_ID, SECRET, TOKEN = "AKIAEXAMPLE000000001", "Secret/Key+Example0000000000000000000001", "session-token-0001"

CASES = [
    ("s3", "GET", "https://b.s3.eu-west-1.amazonaws.com/?list-type=2&prefix=a%2Fb&max-keys=10", b""),
    ("s3", "PUT", "https://b.s3.eu-west-1.amazonaws.com/dir/my%20file%2Bplus%E1%88%B4.txt", b"data"),
    ("s3", "GET", "https://b.s3.eu-west-1.amazonaws.com/a//double/./dot", b""),
    ("execute-api", "POST", "https://api.test/v1/a%20b/../run?z=1&a=2", b'{"q": 1}'),
]


@pytest.mark.parametrize(("service", "method", "url", "body"), CASES, ids=[c[2].split("/", 3)[3] for c in CASES])
def test_same_signature_as_botocore(service: str, method: str, url: str, body: bytes) -> None:
    creds = botocore_credentials.Credentials(KEY_ID, SECRET, TOKEN)
    request = botocore_awsrequest.AWSRequest(method=method, url=url, data=body)
    auth_class = botocore_auth.S3SigV4Auth if service == "s3" else botocore_auth.SigV4Auth
    auth_class(creds, service, "eu-west-1").add_auth(request)
    authorization = request.headers["Authorization"]
    names = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    split = urlsplit(url)
    headers = [(k, v) for k, v in request.headers.items() if k.lower() != "authorization"]
    if not any(k.lower() == "host" for k, _ in headers):
        headers.append(("host", split.netloc))
    payload = request.headers.get("X-Amz-Content-SHA256") or hashlib.sha256(body).hexdigest()
    ours = sigv4.sign(method=method, path=split.path, query=split.query or None, headers=headers, signed=names,
                      payload_hash=payload, access_key_id=KEY_ID, secret_key=SECRET, region="eu-west-1",
                      service=service, amz_date=request.headers["X-Amz-Date"], normalize=service != "s3")  # fmt: skip
    assert ours.authorization == authorization
