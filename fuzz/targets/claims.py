"""The claims a peer's certificate carries: the extension's DER UTF8String and the canonical JSON inside it
(``supervisor.protocol.certs.claims_from_extension_value``, ``supervisor.protocol.claims``).

Oracles beyond "no crash":

* any extension content yields claims and a role or raises ``ClaimsError``, nothing else;
* what is accepted round-trips: re-encoding gives content that decodes to the same claims and role and
  re-encodes to its own bytes (the encoding is canonical), and the claims verify against themselves;
* the JSON alone (the bootstrap bundle's ``claims.json`` reader) obeys the same rule.
"""

from __future__ import annotations

from supervisor.protocol.certs import claims_extension_value, claims_from_extension_value
from supervisor.protocol.claims import ClaimsError, claims_json, parse_claims_json, verify_claims


def one_input(data: bytes) -> None:
    try:
        claims, role = claims_from_extension_value(data)
    except ClaimsError:
        pass
    else:
        value = claims_extension_value(claims, role)
        assert claims_from_extension_value(value) == (claims, role)
        assert claims_extension_value(*claims_from_extension_value(value)) == value
        verify_claims(claims, role, claims, role)
    try:
        plain = parse_claims_json(data)
    except ClaimsError:
        return
    assert parse_claims_json(claims_json(plain)) == plain
