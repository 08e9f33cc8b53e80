"""Re-signing an admitted request with an access key pair the agent never holds (docs/reference/policy.md §1.4,
§3.13 ``credential_signing``), pure; the inspected session calls :func:`plan` before the credential rewrite and
:func:`signed_headers` on the final request.

Rules:

1. The agent signs with the placeholder pair its environment holds; the key id in its ``Authorization`` chooses
   the pair, which must be bound to the request's endpoint. No signature, another scheme, or a key id of no pair
   bound there is refused (``403 credential_endpoint_mismatch``): the agent chose the wrong credential.
2. The agent's ``Authorization``, ``X-Amz-Date``, ``X-Amz-Security-Token`` and ``X-Amz-Content-Sha256`` are dropped;
   control sets a fresh date, the pair's real session token (when it has one) and the payload hash, and signs
   every header it sends but the few a hop may change (``expect``, ``user-agent``, ``x-amzn-trace-id``, framing).
3. Payload (``x-amz-content-sha256`` as the agent sent it): ``sigv4`` hashes the body when the agent sent a hex
   hash or none (``Content-Length`` required, at most :data:`MAX_SIGNED_BODY` bytes, buffered; ``Expect:
   100-continue`` is answered by control so the client sends it), signs ``UNSIGNED-PAYLOAD`` and
   ``STREAMING-UNSIGNED-PAYLOAD-TRAILER`` as they are and streams the body; every other ``STREAMING-*`` (chunk
   signatures control cannot make) is refused. ``sigv4:no_body`` signs ``UNSIGNED-PAYLOAD`` (or the unsigned
   trailer form the client chose); ``sigv4:body`` always hashes, and refuses streaming forms.
4. A presigned URL (``X-Amz-Signature`` or ``X-Amz-Credential`` in the query) is refused, never re-signed: a URL
   signed with the real key would be a bearer credential the agent could hand anywhere.
5. Region: the endpoint's ``signing_region``, else the AWS region named in the host, else ``us-east-1``. S3 signs
   the path as sent; other services the normalised path (``sigv4`` rule 1).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from supervisor.control.credentials import Credential, Credentials, Resolution
from supervisor.control.l7 import sigv4
from supervisor.protocol.responses import ErrorCode

__all__ = ["MAX_SIGNED_BODY", "Payload", "Plan", "SigningConfig", "SigningRefusal", "plan", "region_of",
           "signed_headers"]  # fmt: skip

MAX_SIGNED_BODY = 10 * 1024 * 1024
UNSIGNED = "UNSIGNED-PAYLOAD"
TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
_DROPPED = frozenset({"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"})
_UNSIGNED_HEADERS = frozenset({"expect", "user-agent", "x-amzn-trace-id", "transfer-encoding", "connection",
                               "keep-alive", "te", "trailer", "upgrade", "proxy-connection"})  # fmt: skip
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_REGION = re.compile(r"(?:^|[.-])([a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d{1,2})(?=\.|$)")
_PRESIGNED = frozenset({"x-amz-signature", "x-amz-credential"})


class Payload(enum.Enum):
    """What the signature says of the body; the unsigned forms' values are the ``x-amz-content-sha256`` sent."""

    HASHED = "hashed"  # buffered and hashed
    UNSIGNED = "UNSIGNED-PAYLOAD"
    TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"


@dataclass(frozen=True)
class SigningConfig:
    mode: str  # sigv4, sigv4:body, sigv4:no_body
    service: str
    region: str | None


class SigningRefusal(Exception):
    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Plan:
    credential: Credential
    payload: Payload
    headers: list[tuple[str, str]]  # the agent's headers without its signature (rule 2)
    region: str
    service: str
    declared_hash: bool  # the agent sent x-amz-content-sha256: so does control


def region_of(host: str) -> str | None:
    """The AWS region a host names (``s3.eu-west-1.amazonaws.com``, ``s3-us-west-2.amazonaws.com``), if any."""
    match = _REGION.search(host.lower())
    return match.group(1) if match else None


def _payload(mode: str, declared: str | None) -> Payload:
    """Rule 3."""
    streaming = declared is not None and declared.upper().startswith("STREAMING-")
    if streaming and declared != TRAILER:
        raise SigningRefusal(ErrorCode.INVALID_REQUEST, f"x-amz-content-sha256 {str(declared)[:60]} asks for chunk "
                             "signatures, which control cannot make for a key it holds: send UNSIGNED-PAYLOAD, "
                             f"{TRAILER} or the body's sha256")  # fmt: skip
    if mode == "sigv4:body":
        if streaming:
            raise SigningRefusal(ErrorCode.INVALID_REQUEST, "this endpoint signs whole bodies (sigv4:body): "
                                 f"send the body with its sha256 rather than {TRAILER} (boto3: "
                                 "request_checksum_calculation='when_required')")  # fmt: skip
        return Payload.HASHED
    if declared == TRAILER:
        return Payload.TRAILER
    if mode == "sigv4:no_body" or declared == UNSIGNED:
        return Payload.UNSIGNED
    if declared is None or _HEX64.fullmatch(declared):
        return Payload.HASHED
    raise SigningRefusal(ErrorCode.INVALID_REQUEST, "x-amz-content-sha256 must be a sha256, UNSIGNED-PAYLOAD or "
                         f"{TRAILER}")  # fmt: skip


def plan(config: SigningConfig, creds: Credentials, *, host: str, port: int, path: str, query: str | None,
         headers: Sequence[tuple[str, str]], has_body: bool, content_length: int | None) -> Plan:  # fmt: skip
    """Rules 1, 3 and 4 for a request to ``host:port`` + canonical ``path``; raises :class:`SigningRefusal`."""
    if query and any(item.partition("=")[0].lower() in _PRESIGNED for item in query.split("&")):
        raise SigningRefusal(ErrorCode.INVALID_REQUEST, "presigned URLs are not re-signed: control signs requests "
                             "with the real key only in the Authorization header; send the request signed with the "
                             "placeholder key pair instead")  # fmt: skip
    auth = [v for n, v in headers if n.lower() == "authorization"]
    key_id = sigv4.authorization_key_id(auth[0]) if len(auth) == 1 else None
    if key_id is None:
        raise SigningRefusal(ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH, f"{host}:{port} signs requests with an access "
                             "key pair: sign the request (AWS4-HMAC-SHA256) with the placeholder key pair in the "
                             "agent's environment")  # fmt: skip
    resolution, cred = creds.key_pair_for(key_id, host, port, path)
    if resolution is Resolution.ENDPOINT_MISMATCH or cred is None:
        which = f"the key pair {cred.name}, which is bound to other endpoints" if cred is not None else (
            "a key id that is no placeholder key pair bound here")  # fmt: skip
        raise SigningRefusal(ErrorCode.CREDENTIAL_ENDPOINT_MISMATCH, f"the request to {host}:{port} is signed with "
                             f"{which}: the wrong credential was chosen")  # fmt: skip
    if resolution is Resolution.UNAVAILABLE:
        raise SigningRefusal(ErrorCode.CREDENTIAL_UNAVAILABLE, f"the key pair {cred.name} is not available to control")
    declared = [v.strip() for n, v in headers if n.lower() == "x-amz-content-sha256"]
    payload = _payload(config.mode, declared[0] if declared else None)
    if payload is Payload.HASHED and has_body:
        if content_length is None:
            raise SigningRefusal(ErrorCode.INVALID_REQUEST, "a body signed by its hash needs Content-Length")
        if content_length > MAX_SIGNED_BODY:
            raise SigningRefusal(ErrorCode.INVALID_REQUEST, f"a body signed by its hash is at most {MAX_SIGNED_BODY} "
                                 f"bytes (this one is {content_length}): send it as UNSIGNED-PAYLOAD or "
                                 f"{TRAILER}")  # fmt: skip
    kept = [(n, v) for n, v in headers if n.lower() not in _DROPPED]
    region = config.region or region_of(host) or "us-east-1"
    return Plan(cred, payload, kept, region, config.service, bool(declared))


def signed_headers(p: Plan, *, method: str, target: str, headers: Sequence[tuple[str, str]], payload_hash: str,
                   now: datetime | None = None) -> list[tuple[str, str]]:  # fmt: skip
    """Rule 2: ``headers`` (the final request's, without the agent's signature) with the date, token, payload hash
    and ``Authorization`` added. ``payload_hash`` is the body's sha256 or the unsigned marker; it is sent as
    ``x-amz-content-sha256`` for S3, when the payload is unsigned, or when the agent sent one."""
    pair = p.credential.key_pair
    assert pair is not None and pair.access_key_id is not None and p.credential.secret is not None
    amz_date = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    out = [(n, v) for n, v in headers if n.lower() not in _DROPPED]
    out.append(("X-Amz-Date", amz_date))
    if p.service == "s3" or p.declared_hash or p.payload is not Payload.HASHED:
        out.append(("X-Amz-Content-Sha256", payload_hash))
    if pair.session_token is not None:
        out.append(("X-Amz-Security-Token", pair.session_token))
    path, _q, query = target.partition("?")
    names = sorted({n.lower() for n, _ in out if n.lower() not in _UNSIGNED_HEADERS})
    signed = sigv4.sign(method=method, path=path, query=query if _q else None, headers=out, signed=names,
                        payload_hash=payload_hash, access_key_id=pair.access_key_id, secret_key=p.credential.secret,
                        region=p.region, service=p.service, amz_date=amz_date, normalize=p.service != "s3")  # fmt: skip
    out.append(("Authorization", signed.authorization))
    return out
