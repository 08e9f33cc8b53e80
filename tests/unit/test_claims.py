"""Claims codec and comparison (supervisor/protocol/claims.py): tables of cases plus property tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.protocol.claims import (
    CLAIM_FIELDS,
    CLAIMS_OID,
    MAX_CLAIM_LENGTH,
    ClaimMismatch,
    Claims,
    ClaimsError,
    Role,
    claims_json,
    decode_claims,
    encode_claims,
    parse_claims_json,
    spiffe_uri,
    verify_claims,
)
from tests.certs_fixtures import SAMPLE_CLAIMS, differing, sample_claims

STRING_FIELDS = [f for f in CLAIM_FIELDS if f != "generation"]


def sample_dict(**changes: Any) -> dict[str, Any]:
    d: dict[str, Any] = dict(SAMPLE_CLAIMS.to_dict())
    d["role"] = "control"
    d.update(changes)
    return d


def raw(d: dict[str, Any]) -> bytes:
    return json.dumps(d).encode()


# --- basics ---------------------------------------------------------------------------------------------------


def test_role_other() -> None:
    assert Role.CONTROL.other() is Role.BOUNDARY
    assert Role.BOUNDARY.other() is Role.CONTROL
    assert [str(r) for r in Role] == ["control", "boundary", "operator"]
    with pytest.raises(ValueError, match="no link peer"):
        Role.OPERATOR.other()


def test_oid_is_under_the_private_enterprise_arc() -> None:
    assert CLAIMS_OID.dotted_string.startswith("1.3.6.1.4.1.")


def test_field_order_is_the_documented_one() -> None:
    assert CLAIM_FIELDS == (
        "namespace",
        "sandbox",
        "sandbox_uid",
        "control_deployment",
        "network_policy",
        "image",
        "generation",
        "policy_resource",
    )
    assert list(SAMPLE_CLAIMS.to_dict()) == list(CLAIM_FIELDS)


@pytest.mark.parametrize("role", list(Role))
def test_round_trip(role: Role) -> None:
    assert decode_claims(encode_claims(SAMPLE_CLAIMS, role)) == (SAMPLE_CLAIMS, role)
    assert Claims.from_dict(SAMPLE_CLAIMS.to_dict()) == SAMPLE_CLAIMS
    assert parse_claims_json(claims_json(SAMPLE_CLAIMS)) == SAMPLE_CLAIMS


def test_canonical_bytes_exact() -> None:
    claims = sample_claims(
        namespace="ns",
        sandbox="bot",
        sandbox_uid="u",
        control_deployment="c",
        network_policy="np",
        image="img",
        generation=7,
        policy_resource="ConfigMap/p@1",
    )
    assert encode_claims(claims, Role.BOUNDARY) == (
        b'{"control_deployment":"c","generation":7,"image":"img","namespace":"ns","network_policy":"np",'
        b'"policy_resource":"ConfigMap/p@1","role":"boundary","sandbox":"bot","sandbox_uid":"u"}'
    )
    assert claims_json(claims) == (
        b'{"control_deployment":"c","generation":7,"image":"img","namespace":"ns","network_policy":"np",'
        b'"policy_resource":"ConfigMap/p@1","sandbox":"bot","sandbox_uid":"u"}'
    )


def test_canonical_bytes_are_utf8_not_escaped() -> None:
    encoded = encode_claims(sample_claims(sandbox="bücher-\u2603"), Role.CONTROL)
    assert "bücher-\u2603".encode() in encoded
    assert b"\\u" not in encoded


def test_non_canonical_input_is_accepted() -> None:
    d = sample_dict()
    pretty = json.dumps(dict(reversed(list(d.items()))), indent=4, ensure_ascii=True).encode()
    assert decode_claims(pretty) == (SAMPLE_CLAIMS, Role.CONTROL)
    assert encode_claims(*decode_claims(pretty)) == encode_claims(SAMPLE_CLAIMS, Role.CONTROL)


def test_boundary_values_accepted() -> None:
    longest = "x" * MAX_CLAIM_LENGTH
    claims = sample_claims(image=longest, generation=0)
    assert decode_claims(encode_claims(claims, Role.CONTROL))[0] == claims
    assert sample_claims(generation=2**63 - 1).generation == 2**63 - 1


# --- malformed input: one table -----------------------------------------------------------------------------

_MALFORMED: list[tuple[str, bytes, str | None]] = []


def _case(name: str, data: bytes, field: str | None) -> None:
    _MALFORMED.append((name, data, field))


for _f in CLAIM_FIELDS:
    _d = sample_dict()
    del _d[_f]
    _case(f"{_f} missing", raw(_d), _f)
    _case(f"{_f} null", raw(sample_dict(**{_f: None})), _f)
    _case(f"{_f} list", raw(sample_dict(**{_f: ["x"]})), _f)
    _case(f"{_f} object", raw(sample_dict(**{_f: {"x": 1}})), _f)
for _f in STRING_FIELDS:
    _case(f"{_f} int", raw(sample_dict(**{_f: 5})), _f)
    _case(f"{_f} empty", raw(sample_dict(**{_f: ""})), _f)
    _case(f"{_f} NUL", raw(sample_dict(**{_f: "a\x00b"})), _f)
    _case(f"{_f} newline", raw(sample_dict(**{_f: "a\nb"})), _f)
    _case(f"{_f} DEL", raw(sample_dict(**{_f: "a\x7fb"})), _f)
    _case(f"{_f} C1 NEL", raw(sample_dict(**{_f: "a\x85b"})), _f)
    _case(f"{_f} too long", raw(sample_dict(**{_f: "x" * (MAX_CLAIM_LENGTH + 1)})), _f)
for _name, _value in [
    ("string", "3"),
    ("bool true", True),
    ("bool false", False),
    ("float", 3.0),
    ("negative", -1),
    ("too large", 2**63),
]:
    _case(f"generation {_name}", raw(sample_dict(generation=_value)), "generation")
_case("generation NaN", raw(sample_dict()).replace(b'"generation": 3', b'"generation": NaN'), None)
_case("generation Infinity", raw(sample_dict()).replace(b'"generation": 3', b'"generation": Infinity'), None)
_case("generation 5000 digits", raw(sample_dict()).replace(b'"generation": 3', b'"generation": ' + b"9" * 5000), None)
_case("generation exponent", raw(sample_dict()).replace(b'"generation": 3', b'"generation": 3e0'), "generation")
_case("unknown key", raw(sample_dict(extra="x")), "extra")
_case("duplicate key", raw(sample_dict())[:-1] + b', "sandbox": "other"}', "sandbox")
_case("duplicate role", raw(sample_dict())[:-1] + b', "role": "boundary"}', "role")
_case("role missing", raw({k: v for k, v in sample_dict().items() if k != "role"}), "role")
_case("role unknown", raw(sample_dict(role="gateway")), "role")
_case("role upper case", raw(sample_dict(role="CONTROL")), "role")
_case("role int", raw(sample_dict(role=1)), "role")
_case("top-level array", b"[1, 2]", None)
_case("top-level string", b'"control"', None)
_case("top-level null", b"null", None)
_case("empty", b"", None)
_case("truncated", raw(sample_dict())[:-1], None)
_case("trailing garbage", raw(sample_dict()) + b"x", None)
_case("invalid UTF-8", raw(sample_dict(sandbox="ab")).replace(b"ab", b"a\xffb"), None)
_case("UTF-16", json.dumps(sample_dict()).encode("utf-16"), None)
_case("UTF-8 BOM", b"\xef\xbb\xbf" + raw(sample_dict()), None)
_case("deep nesting", b"[" * 100_000 + b"]" * 100_000, None)
_case("oversized", b" " * (1 << 17) + raw(sample_dict()), None)


@pytest.mark.parametrize(("name", "data", "field"), _MALFORMED, ids=[c[0] for c in _MALFORMED])
def test_malformed_rejected(name: str, data: bytes, field: str | None) -> None:
    with pytest.raises(ClaimsError) as info:
        decode_claims(data)
    if field is not None:
        assert info.value.field == field
        assert field in str(info.value)


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_lone_surrogate_names_field(field: str) -> None:
    data = raw(sample_dict()).replace(b'"%s": "' % field.encode(), b'"%s": "\\udc80' % field.encode())
    with pytest.raises(ClaimsError) as info:
        decode_claims(data)
    assert info.value.field == field


@pytest.mark.parametrize("bad", [None, [], "claims", 3, sample_dict()], ids=["None", "list", "str", "int", "role"])
def test_from_dict_is_strict(bad: object) -> None:
    # A dict with "role" is refused too: claims.json carries no role, and from_dict allows no unknown key.
    with pytest.raises(ClaimsError):
        Claims.from_dict(bad)


@pytest.mark.parametrize("field", CLAIM_FIELDS)
def test_constructor_validates(field: str) -> None:
    bad: object = True if field == "generation" else ""
    with pytest.raises(ClaimsError) as info:
        sample_claims(**{field: bad})  # type: ignore[arg-type]
    assert info.value.field == field


def test_parse_claims_json_refuses_role() -> None:
    with pytest.raises(ClaimsError) as info:
        parse_claims_json(encode_claims(SAMPLE_CLAIMS, Role.CONTROL))
    assert info.value.field == "role"


def test_non_bytes_input_is_a_claims_error() -> None:
    with pytest.raises(ClaimsError):
        decode_claims("{}")  # type: ignore[arg-type]


# --- SPIFFE URI -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "sandbox", "role", "uri"),
    [
        ("agents-team-a", "review-bot", Role.CONTROL, "spiffe://openshell/ns/agents-team-a/sandbox/review-bot/control"),
        ("a_b.c", "X1", Role.BOUNDARY, "spiffe://openshell/ns/a_b.c/sandbox/X1/boundary"),
        ("a/b", "c d", Role.CONTROL, "spiffe://openshell/ns/a%2Fb/sandbox/c%20d/control"),
        ("ü", "%", Role.CONTROL, "spiffe://openshell/ns/%C3%BC/sandbox/%25/control"),
        (".", "..", Role.CONTROL, "spiffe://openshell/ns/%2E/sandbox/%2E%2E/control"),
        ("~", "?#", Role.CONTROL, "spiffe://openshell/ns/%7E/sandbox/%3F%23/control"),
    ],
)
def test_spiffe_uri(namespace: str, sandbox: str, role: Role, uri: str) -> None:
    assert spiffe_uri(sample_claims(namespace=namespace, sandbox=sandbox), role) == uri


# --- verification ---------------------------------------------------------------------------------------------


def test_verify_equal_passes() -> None:
    verify_claims(SAMPLE_CLAIMS, Role.CONTROL, sample_claims(), Role.CONTROL)


@pytest.mark.parametrize("field", CLAIM_FIELDS)
def test_verify_names_each_differing_field(field: str) -> None:
    peer = differing(SAMPLE_CLAIMS, field)
    with pytest.raises(ClaimMismatch) as info:
        verify_claims(peer, Role.BOUNDARY, SAMPLE_CLAIMS, Role.BOUNDARY)
    assert info.value.field == field
    assert info.value.expected == str(getattr(SAMPLE_CLAIMS, field))
    assert info.value.got == str(getattr(peer, field))
    assert field in str(info.value)


def test_verify_role_first() -> None:
    peer = differing(SAMPLE_CLAIMS, "namespace")
    with pytest.raises(ClaimMismatch) as info:
        verify_claims(peer, Role.BOUNDARY, SAMPLE_CLAIMS, Role.CONTROL)
    assert (info.value.field, info.value.expected, info.value.got) == ("role", "control", "boundary")


def test_verify_reports_first_field_in_order() -> None:
    peer = differing(differing(differing(SAMPLE_CLAIMS, "policy_resource"), "image"), "sandbox_uid")
    with pytest.raises(ClaimMismatch) as info:
        verify_claims(peer, Role.CONTROL, SAMPLE_CLAIMS, Role.CONTROL)
    assert info.value.field == "sandbox_uid"


# --- properties -------------------------------------------------------------------------------------------------

claim_text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40)
claims_strategy = st.builds(
    Claims,
    namespace=claim_text,
    sandbox=claim_text,
    sandbox_uid=claim_text,
    control_deployment=claim_text,
    network_policy=claim_text,
    image=claim_text,
    generation=st.integers(min_value=0, max_value=2**63 - 1),
    policy_resource=claim_text,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(claims_strategy, st.sampled_from(list(Role)))
def test_property_valid_claims_round_trip(claims: Claims, role: Role) -> None:
    encoded = encode_claims(claims, role)
    assert decode_claims(encoded) == (claims, role)
    assert encode_claims(*decode_claims(encoded)) == encoded
    assert parse_claims_json(claims_json(claims)) == claims
    assert Claims.from_dict(claims.to_dict()) == claims


def _decodes_or_claims_error(data: bytes) -> None:
    try:
        claims, role = decode_claims(data)
    except ClaimsError:
        return
    assert isinstance(claims, Claims) and isinstance(role, Role)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400))
def test_property_arbitrary_bytes(data: bytes) -> None:
    _decodes_or_claims_error(data)
    try:
        parse_claims_json(data)
    except ClaimsError:
        pass


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_property_arbitrary_json(value: object) -> None:
    _decodes_or_claims_error(json.dumps(value).encode())


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([*CLAIM_FIELDS, "role", "x"]), json_values, max_size=10))
def test_property_claim_shaped_objects(value: dict[str, object]) -> None:
    _decodes_or_claims_error(json.dumps(value).encode())


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_property_mutated_encoding(data: st.DataObject) -> None:
    encoded = bytearray(encode_claims(SAMPLE_CLAIMS, Role.BOUNDARY))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(encoded) - 1))
        encoded[i] = data.draw(st.integers(0, 255))
    _decodes_or_claims_error(bytes(encoded))


# --- each refusal says exactly why (a peer's certificate is refused with this text; the mutation run asked) ------

REFUSALS: list[tuple[object, str, str | None]] = [
    ("not bytes", "claims must be bytes, got str", None),
    (b"\xff", "claims are not UTF-8: invalid start byte at byte 0", None),
    (b"[1]", "claims must be a JSON object, got list", None),
    (b'{"a": NaN}', "non-standard JSON constant NaN", None),
    (b'{"a": Infinity}', "non-standard JSON constant Infinity", None),
    (b'{"a": 1, "a": 2}', "duplicate key 'a'", "a"),
    (b"[" * 100_000, "claims are larger than 65536 bytes", None),
    (b"[" * 60_000, "claims JSON is nested too deeply", None),
    (b"{", "claims are not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
     None),
    (b"{}", "claim 'role' is missing", "role"),
    (b'{"role": 1}', "claim 'role' must be a string", "role"),
    (b'{"role": "admin"}', "claim 'role' is 'admin', not one of control, boundary, operator", "role"),
    (b'{"role": "control", "extra": 1}', "unknown claim 'extra'", "extra"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "message", "field"), REFUSALS)
def test_each_malformed_encoding_says_why(data: Any, message: str, field: str | None) -> None:
    with pytest.raises(ClaimsError) as info:
        decode_claims(data)
    assert (str(info.value), info.value.field) == (message, field)


def test_each_malformed_claim_says_why() -> None:
    good = SAMPLE_CLAIMS.to_dict()
    for patch, message in (
        ({"generation": True}, "claim 'generation' must be an integer, got bool"),
        ({"generation": 2**63}, "claim 'generation' must be in [0, 2**63)"),
        ({"sandbox": 7}, "claim 'sandbox' must be a string, got int"),
    ):
        with pytest.raises(ClaimsError) as info:
            Claims.from_dict({**good, **patch})
        assert str(info.value) == message
    with pytest.raises(ClaimsError) as info:
        Claims.from_dict(["not", "a", "dict"])
    assert str(info.value) == "claims must be a JSON object, got list"
    long_key = "k" * 200
    with pytest.raises(ClaimsError) as info:
        Claims.from_dict({**good, long_key: 1})
    assert info.value.field == "k" * 80 and str(info.value) == "unknown claim " + repr(long_key)[:80]
    with pytest.raises(ClaimsError) as info:
        decode_claims(b'{"' + long_key.encode() + b'": 1, "' + long_key.encode() + b'": 2}')
    assert info.value.field == "k" * 80


def test_an_encoding_of_exactly_the_size_limit_is_read() -> None:
    body = encode_claims(SAMPLE_CLAIMS, Role.CONTROL)
    padded = body[:-1] + b" " * (64 * 1024 - len(body)) + b"}"
    assert len(padded) == 64 * 1024 and decode_claims(padded) == (SAMPLE_CLAIMS, Role.CONTROL)


def test_a_mismatch_carries_its_field_and_both_values() -> None:
    with pytest.raises(ClaimMismatch) as info:
        verify_claims(SAMPLE_CLAIMS, Role.CONTROL, SAMPLE_CLAIMS, Role.BOUNDARY)
    assert info.value.args == ("role", "boundary", "control")


def test_the_operator_role_has_no_link_peer() -> None:
    with pytest.raises(ValueError, match=r"^the operator role has no link peer$"):
        Role.OPERATOR.other()
