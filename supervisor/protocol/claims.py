"""Sandbox claims: what binds a certificate to one sandbox and one role (docs/design.md "Claims").

Rules this module enforces:

1. A ``Claims`` value is always valid. Every string is non-empty, at most 512 characters, with no control
   character, no NUL and no lone surrogate; ``generation`` is an ``int`` (never a ``bool``) in [0, 2**63).
   The constructor checks this, so nothing downstream re-validates.
2. The wire form is canonical JSON: sorted keys, ``(",", ":")`` separators, UTF-8 without ``\\u`` escapes.
   The same claims always encode to the same bytes.
3. Decoding is strict and total: any input either yields ``(Claims, Role)`` or raises ``ClaimsError``.
   Duplicate keys, unknown keys, missing keys and wrong types are refused, each naming the field.
4. Verification compares peer claims with the expected ones *exactly*, role first, then the fields in
   ``CLAIM_FIELDS`` order, and reports the first difference. Claims are not secret, so the error carries
   both values.

The claims travel in a certificate extension under ``CLAIMS_OID`` (see ``certs.py``), and readably in a
SPIFFE-style URI SAN built by ``spiffe_uri``.
"""

from __future__ import annotations

import enum
import json
import unicodedata
from dataclasses import dataclass, fields
from typing import NoReturn

from cryptography import x509

from supervisor.protocol.json_value import JsonValue

__all__ = [
    "CLAIMS_OID",
    "CLAIM_FIELDS",
    "LINK_ROLES",
    "MAX_CLAIM_LENGTH",
    "ClaimMismatch",
    "Claims",
    "ClaimsError",
    "Role",
    "claims_json",
    "decode_claims",
    "encode_claims",
    "parse_claims_json",
    "spiffe_uri",
    "verify_claims",
]

# Private, unregistered arc (1.3.6.1.4.1 is IANA's "private enterprise" arc; 59999 is not assigned to this
# project). Nothing outside openshell-sandbox interprets it; the extension is non-critical so that other
# X.509 tooling (openssl x509 -text, browsers) still reads the certificate.
CLAIMS_OID = x509.ObjectIdentifier("1.3.6.1.4.1.59999.7.1")

# Comparison order: the first field that differs is the one an error names.
CLAIM_FIELDS: tuple[str, ...] = (
    "namespace",
    "sandbox",
    "sandbox_uid",
    "control_deployment",
    "network_policy",
    "image",
    "generation",
    "policy_resource",
)

MAX_CLAIM_LENGTH = 512
MAX_GENERATION = 2**63 - 1  # Kubernetes metadata.generation is an int64
MAX_ENCODED_SIZE = 64 * 1024  # far above any valid encoding; stops pathological input early
_ROLE_KEY = "role"


class Role(enum.StrEnum):
    """Who a certificate speaks for. ``control`` and ``boundary`` are the two ends of the links; ``operator`` is
    a person or tool outside the pod, accepted only by control's TCP operator API (docs/design.md "Remote
    operators") and refused on every link, since a link expects exactly ``other()`` of its own role."""

    CONTROL = "control"
    BOUNDARY = "boundary"
    OPERATOR = "operator"

    def other(self) -> Role:
        """The link peer's role; an operator has no link peer (``ValueError``)."""
        if self is Role.OPERATOR:
            raise ValueError("the operator role has no link peer")
        return Role.BOUNDARY if self is Role.CONTROL else Role.CONTROL


LINK_ROLES: tuple[Role, ...] = (Role.CONTROL, Role.BOUNDARY)  # the roles of every bootstrap bundle


class ClaimsError(ValueError):
    """Malformed claims (peer misbehaved or bad input); ``field`` names the offending key when known."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ClaimMismatch(Exception):
    """Well-formed claims that differ from the expected ones; ``field`` is the first differing field."""

    def __init__(self, field: str, expected: str, got: str) -> None:
        super().__init__(field, expected, got)
        self.field = field
        self.expected = expected
        self.got = got

    def __str__(self) -> str:
        return f"claim {self.field!r} differs: expected {self.expected!r}, got {self.got!r}"


def _check_string(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise ClaimsError(f"claim {name!r} must be a string, got {type(value).__name__}", field=name)
    if not value:
        raise ClaimsError(f"claim {name!r} must not be empty", field=name)
    if len(value) > MAX_CLAIM_LENGTH:
        raise ClaimsError(f"claim {name!r} is longer than {MAX_CLAIM_LENGTH} characters", field=name)
    for ch in value:
        # Cc covers NUL, C0, DEL and C1; Cs (lone surrogates) cannot be encoded as UTF-8.
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise ClaimsError(f"claim {name!r} contains the control character U+{ord(ch):04X}", field=name)


def _check_generation(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClaimsError(f"claim 'generation' must be an integer, got {type(value).__name__}", field="generation")
    if not 0 <= value <= MAX_GENERATION:
        raise ClaimsError("claim 'generation' must be in [0, 2**63)", field="generation")


@dataclass(frozen=True)
class Claims:
    """The claim set of one sandbox, independent of role."""

    namespace: str
    sandbox: str
    sandbox_uid: str
    control_deployment: str
    network_policy: str
    image: str
    generation: int
    policy_resource: str

    def __post_init__(self) -> None:
        for name in CLAIM_FIELDS:
            value = getattr(self, name)
            if name == "generation":
                _check_generation(value)
            else:
                _check_string(name, value)

    def to_dict(self) -> dict[str, str | int]:
        return {name: getattr(self, name) for name in CLAIM_FIELDS}

    @classmethod
    def from_dict(cls, d: object) -> Claims:
        """Strict: exactly the claim keys, each with the right type; raises ``ClaimsError``."""
        if not isinstance(d, dict):
            raise ClaimsError(f"claims must be a JSON object, got {type(d).__name__}")
        for key in d:
            if key not in _FIELD_SET:
                raise ClaimsError(f"unknown claim {key!r:.80}", field=str(key)[:80])
        for name in CLAIM_FIELDS:
            if name not in d:
                raise ClaimsError(f"claim {name!r} is missing", field=name)
        return cls(**{name: d[name] for name in CLAIM_FIELDS})


_FIELD_SET = frozenset(CLAIM_FIELDS)
assert tuple(f.name for f in fields(Claims)) == CLAIM_FIELDS


def _canonical(obj: dict[str, str | int]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_claims(claims: Claims, role: Role) -> bytes:
    """Canonical JSON of the claims plus ``role``: the certificate extension's content."""
    body = claims.to_dict()
    body[_ROLE_KEY] = str(Role(role))
    return _canonical(body)


def claims_json(claims: Claims) -> bytes:
    """Canonical JSON of the claims alone (no role): the bootstrap bundle's ``claims.json``."""
    return _canonical(claims.to_dict())


def _reject_duplicates(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    out: dict[str, JsonValue] = {}
    for key, value in pairs:
        if key in out:
            raise ClaimsError(f"duplicate key {key!r:.80}", field=key[:80])
        out[key] = value
    return out


def _reject_constant(name: str) -> NoReturn:
    raise ClaimsError(f"non-standard JSON constant {name}")


def _load_object(data: bytes) -> JsonValue:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ClaimsError(f"claims must be bytes, got {type(data).__name__}")
    if len(data) > MAX_ENCODED_SIZE:
        raise ClaimsError(f"claims are larger than {MAX_ENCODED_SIZE} bytes")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClaimsError(f"claims are not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        value: JsonValue = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)
    except ClaimsError:
        raise
    except RecursionError:
        raise ClaimsError("claims JSON is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int conversion limits on huge numbers
        raise ClaimsError(f"claims are not valid JSON: {exc}") from None
    return value


def decode_claims(data: bytes) -> tuple[Claims, Role]:
    """Parse a certificate's claims extension content; any valid JSON object with exactly the keys."""
    obj = _load_object(data)
    if not isinstance(obj, dict):
        raise ClaimsError(f"claims must be a JSON object, got {type(obj).__name__}")
    if _ROLE_KEY not in obj:
        raise ClaimsError("claim 'role' is missing", field=_ROLE_KEY)
    raw_role = obj.pop(_ROLE_KEY)
    if not isinstance(raw_role, str):
        raise ClaimsError("claim 'role' must be a string", field=_ROLE_KEY)
    try:
        role = Role(raw_role)
    except ValueError:
        known = ", ".join(str(r) for r in Role)
        raise ClaimsError(f"claim 'role' is {raw_role!r:.80}, not one of {known}", field=_ROLE_KEY) from None
    return Claims.from_dict(obj), role


def parse_claims_json(data: bytes) -> Claims:
    """Parse a bundle's ``claims.json`` (no role key)."""
    return Claims.from_dict(_load_object(data))


def _uri_segment(value: str) -> str:
    # SPIFFE path segments allow only [A-Za-z0-9._-]; percent-encode every other UTF-8 byte, and the dots
    # of a "." or ".." segment, which SPIFFE forbids.
    if value in (".", ".."):
        return "%2E" * len(value)
    out = []
    for byte in value.encode("utf-8"):
        ch = chr(byte)
        if ch.isascii() and (ch.isalnum() or ch in "._-"):
            out.append(ch)
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def spiffe_uri(claims: Claims, role: Role) -> str:
    """``spiffe://openshell/ns/<ns>/sandbox/<name>/<role>``: readable only; never used for verification."""
    return f"spiffe://openshell/ns/{_uri_segment(claims.namespace)}/sandbox/{_uri_segment(claims.sandbox)}/{Role(role)}"


def verify_claims(peer: Claims, peer_role: Role, expected: Claims, expected_role: Role) -> None:
    """Raise ``ClaimMismatch`` for the first difference: role, then ``CLAIM_FIELDS`` in order."""
    if peer_role != expected_role:
        raise ClaimMismatch(_ROLE_KEY, str(expected_role), str(peer_role))
    for name in CLAIM_FIELDS:
        want = getattr(expected, name)
        got = getattr(peer, name)
        # type() as well: 3 == 3.0 and 1 == True in Python, but not in claims (Claims forbids both anyway).
        if want != got or type(want) is not type(got):
            raise ClaimMismatch(name, str(want), str(got))
