"""The response scrubber (``l7.scrub``): a secret never reaches the agent, however the body is chunked."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from supervisor.control.l7.scrub import Scrubber, bound_request_headers, unscrubbable, valid_name

SECRET, PLACEHOLDER = "ghp_REAL-secret-0123", "openshell:resolve:env:GITHUB_TOKEN"
OTHER, OTHER_PLACEHOLDER = "sk-other-9999", "openshell:resolve:env:OTHER"


def run(scrubber: Scrubber, chunks: list[bytes]) -> bytes:
    return b"".join(scrubber.feed(c) for c in chunks) + scrubber.flush()


def test_a_secret_split_across_two_chunks_is_replaced() -> None:
    body = b'{"echo": "Bearer ' + SECRET.encode() + b'"}'
    cut = body.index(b"REAL") + 2
    out = run(Scrubber([(SECRET, PLACEHOLDER)]), [body[:cut], body[cut:]])
    assert out == body.replace(SECRET.encode(), PLACEHOLDER.encode())


def test_headers_and_several_secrets() -> None:
    scrubber = Scrubber([(SECRET, PLACEHOLDER), (OTHER, OTHER_PLACEHOLDER)])
    assert scrubber.header(f"x {SECRET} y {OTHER}".encode()) == f"x {PLACEHOLDER} y {OTHER_PLACEHOLDER}".encode()
    assert scrubber.replaced == 2


def test_without_secrets_nothing_is_held_back() -> None:
    scrubber = Scrubber([])
    assert not scrubber and scrubber.feed(b"abc") == b"abc" and scrubber.flush() == b""


@given(
    st.binary(max_size=200),
    st.lists(st.integers(min_value=0, max_value=260), max_size=8),
    st.integers(min_value=0, max_value=4),
)
def test_any_chunking_gives_the_same_scrubbed_body(noise: bytes, cuts: list[int], copies: int) -> None:
    body = noise[: len(noise) // 2] + (SECRET.encode() + b"-") * copies + noise[len(noise) // 2 :]
    points = sorted({min(c, len(body)) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    out = run(Scrubber([(SECRET, PLACEHOLDER)]), chunks)
    assert SECRET.encode() not in out
    assert out == body.replace(SECRET.encode(), PLACEHOLDER.encode())


# --- every part of a response head ------------------------------------------------------------------------------


def test_the_reason_phrase_carries_the_placeholder() -> None:
    scrubber = Scrubber([(SECRET, PLACEHOLDER)])
    assert scrubber.reason(f"OK {SECRET}".encode()) == f"OK {PLACEHOLDER}".encode()
    assert scrubber.replaced == 1


def test_a_header_name_is_matched_in_any_case_and_a_placeholder_there_is_no_token() -> None:
    """The canonical placeholder holds ``:``: a name with it is invalid, and the session refuses the response."""
    scrubber = Scrubber([(SECRET, PLACEHOLDER)])
    for name in (f"X-{SECRET}", f"x-{SECRET.lower()}", f"X-{SECRET.upper()}"):
        scrubbed = scrubber.name(name.encode())
        assert scrubbed == f"{name[:2]}{PLACEHOLDER}".encode()
        assert not valid_name(scrubbed)
    assert scrubber.replaced == 3
    assert scrubber.name(b"Content-Type") == b"Content-Type" and valid_name(b"Content-Type")


def test_a_token_shaped_placeholder_leaves_a_valid_name() -> None:
    scrubber = Scrubber([(SECRET, "ghp-OPENSHELL-RESOLVE-ENV-GITHUB_TOKEN")])
    scrubbed = scrubber.name(f"X-{SECRET}".encode())
    assert scrubbed == b"X-ghp-OPENSHELL-RESOLVE-ENV-GITHUB_TOKEN" and valid_name(scrubbed)


def test_without_secrets_names_and_reasons_pass_untouched() -> None:
    scrubber = Scrubber([])
    assert scrubber.name(b"X-Thing") == b"X-Thing" and scrubber.reason(b"OK") == b"OK" and not scrubber.replaced


# --- what is asked of a bound host, and what it may answer --------------------------------------------------


def test_requests_to_a_bound_host_ask_for_the_whole_representation_uncompressed() -> None:
    headers = [(b"Host", b"api.test"), (b"RANGE", b"bytes=0-3"), (b"If-Range", b'"e1"'),
               (b"accept-encoding", b"gzip, br"), (b"Accept", b"*/*")]  # fmt: skip
    assert bound_request_headers(headers) == [(b"Host", b"api.test"), (b"Accept", b"*/*"),
                                              (b"Accept-Encoding", b"identity")]  # fmt: skip


def test_a_slice_or_a_compressed_body_cannot_be_scrubbed() -> None:
    assert unscrubbable(206, [(b"Content-Range", b"bytes 0-3/40")], has_body=True) is not None
    assert unscrubbable(206, [], has_body=False) is not None  # never a slice, body or not
    assert unscrubbable(200, [(b"Content-Encoding", b"gzip")], has_body=True) is not None
    assert unscrubbable(200, [(b"content-encoding", b"identity, BR")], has_body=True) is not None
    assert unscrubbable(200, [(b"Content-Encoding", b"identity")], has_body=True) is None
    assert unscrubbable(200, [(b"Content-Encoding", b"gzip")], has_body=False) is None  # HEAD, 304: no body
    assert unscrubbable(200, [(b"Content-Type", b"application/gzip")], has_body=True) is None


# --- any secret, any chunking ------------------------------------------------------------------------------------


def _overlaps(secret: bytes, placeholder: bytes) -> bool:
    """Whether a replacement could itself spell the secret (it runs into the placeholder's ends, or is inside it):
    no real secret looks like the marker text, and such pairs are left out of the property."""
    return secret in placeholder or any(placeholder.endswith(secret[:i]) or placeholder.startswith(secret[-i:])
                                        for i in range(1, len(secret)))  # fmt: skip


@given(
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40),
    st.lists(st.binary(max_size=60), min_size=1, max_size=5),
    st.lists(st.integers(min_value=0, max_value=500), max_size=10),
)
def test_for_any_secret_and_chunking_the_output_never_holds_the_secret(secret: str, noise: list[bytes],
                                                                       cuts: list[int]) -> None:  # fmt: skip
    raw = secret.encode()
    assume(not _overlaps(raw, PLACEHOLDER.encode()))
    body = raw.join(noise) + raw  # the secret at least once, between arbitrary bytes
    points = sorted({min(c, len(body)) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    scrubber = Scrubber([(secret, PLACEHOLDER)])
    out = run(scrubber, chunks)
    assert raw not in out
    assert out == body.replace(raw, PLACEHOLDER.encode())


# --- only a tail that could start a secret waits --------------------------------------------------------------


def test_a_chunk_ending_where_no_secret_begins_is_passed_whole() -> None:
    """An SSE event goes to the agent when it arrives, not when the next one comes."""
    scrubber = Scrubber([(SECRET, PLACEHOLDER), (OTHER, OTHER_PLACEHOLDER)])
    event = b'data: {"choices": [{"delta": {"content": "hello "}}]}\n\n'
    assert bytes(scrubber.feed(event)) == event
    # a tail that could be the start of a secret waits, and only that tail
    assert bytes(scrubber.feed(b"data: gh")) == b"data: "
    assert bytes(scrubber.feed(b"p_REAL-secret-0123\n\n")) == PLACEHOLDER.encode() + b"\n\n"
    assert bytes(scrubber.feed(b"x sk-oth")) == b"x "
    assert bytes(scrubber.feed(b"erwise\n")) == b"sk-otherwise\n"  # not a secret after all: passed as it was
    assert scrubber.flush() == b""


_SMALL = st.text(alphabet="abc", min_size=1, max_size=6)  # secrets sharing prefixes and suffixes with each other


@settings(max_examples=400)
@given(st.lists(_SMALL, min_size=1, max_size=4, unique=True), st.data())
def test_no_chunking_lets_any_secret_through_when_secrets_overlap(secrets: list[str], data: st.DataObject) -> None:
    """Secrets that are prefixes of each other, in a body of their pieces and whole copies: whatever the chunking,
    the agent reads exactly what scrubbing the whole body gives, and no secret (placeholders share no letter with
    them)."""
    parts = st.sampled_from([s.encode() for s in secrets] + [b"a", b"b", b"c", b"-", b"\n\n"])
    body = b"".join(data.draw(st.lists(parts, min_size=1, max_size=20)))
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(body)), max_size=12))
    points = sorted(set(cuts))
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    pairs = [(s, f"openshell:resolve:env:K{i}") for i, s in enumerate(secrets)]
    chunked, whole = Scrubber(pairs), Scrubber(pairs)
    out = run(chunked, chunks)
    assert out == whole.header(body)
    assert chunked.replaced == whole.replaced  # the body's search finds what the alternation finds, no more
    assert not any(s.encode() in out for s in secrets)


# --- tables and edges the mutation run asked for (docs/design.md "Testing") -----------------------------------

TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def test_a_name_is_valid_exactly_when_every_byte_is_a_tchar() -> None:
    for byte in range(256):
        assert valid_name(b"X-" + bytes([byte])) is (byte in TCHAR), byte
    assert not valid_name(b"")


def test_every_header_that_asks_for_a_slice_or_a_coding_is_dropped_in_any_case() -> None:
    for name in (b"range", b"if-range", b"accept-encoding"):
        for spelled in (name, name.upper(), name.title()):
            assert bound_request_headers([(spelled, b"x")]) == [(b"Accept-Encoding", b"identity")], spelled
    kept = [(b"Content-Range", b"x"), (b"If-Match", b"x"), (b"TE", b"gzip"), (b"Accept", b"x")]
    assert bound_request_headers(kept) == [*kept, (b"Accept-Encoding", b"identity")]


def test_why_a_response_cannot_be_scrubbed_is_said_exactly() -> None:
    assert unscrubbable(206, [], has_body=True) == "a 206 partial response (a slice of a representation)"
    assert (
        unscrubbable(200, [(b"Content-Encoding", b"br")], has_body=True)
        == "a body in a content coding (Content-Encoding), which the scrubber cannot read"
    )


def test_a_content_coding_after_other_headers_is_seen() -> None:
    headers = [(b"Content-Type", b"text/plain"), (b"X-Other", b"1"), (b"Content-Encoding", b"gzip")]
    assert unscrubbable(200, headers, has_body=True) is not None


def test_a_list_of_identity_codings_and_empty_elements_is_readable() -> None:
    for value in (b"identity,identity", b"identity, ", b",identity", b"", b"IDENTITY ,\tidentity"):
        assert unscrubbable(200, [(b"Content-Encoding", value)], has_body=True) is None, value
    for value in (b"identity,gzip", b"gzip,identity", b"identity identity"):
        assert unscrubbable(200, [(b"Content-Encoding", value)], has_body=True) is not None, value


def test_of_two_secrets_where_one_starts_the_other_the_longer_wins() -> None:
    short, long = "tok_abc", "tok_abcdef"
    scrubber = Scrubber([(short, "P-short"), (long, "P-long")])
    assert scrubber.header(f"[{long}] [{short}]".encode()) == b"[P-long] [P-short]"
    assert Scrubber([(long, "P-long"), (short, "P-short")]).header(long.encode()) == b"P-long"


def test_the_longer_secret_is_waited_for_when_its_last_byte_is_in_the_next_chunk() -> None:
    """A match of the shorter secret at the first held-back byte is not taken while the longer may still follow."""
    short, long = "tok_abc", "tok_abcdef"
    for prefix in (b"", b"x", b"0123456789"):
        scrubber = Scrubber([(short, "P-short"), (long, "P-long")])
        assert run(scrubber, [prefix + long.encode()[:-1], long.encode()[-1:]]) == prefix + b"P-long"


def test_at_most_the_longest_secret_less_one_byte_is_held_back() -> None:
    """Only a tail that could start a secret waits, and never more than the longest secret less one byte."""
    scrubber = Scrubber([(SECRET, PLACEHOLDER), (OTHER, OTHER_PLACEHOLDER)])
    keep = len(SECRET) - 1
    start = SECRET.encode()[:keep]  # the longest tail that could still become the secret
    assert bytes(scrubber.feed(b"." * 100 + start)) == b"." * 100
    assert bytes(scrubber.feed(b"-")) == start + b"-"  # not the secret after all: passed as it was
    assert scrubber.flush() == b"" and bytes(scrubber.feed(b"")) == b""  # nothing is left once the body ended


def test_a_secret_is_caught_whichever_byte_the_chunk_ends_on() -> None:
    raw = SECRET.encode()
    body = b"<" + raw + b">"
    for cut in range(len(body) + 1):
        assert run(Scrubber([(SECRET, PLACEHOLDER)]), [body[:cut], body[cut:]]) == b"<" + PLACEHOLDER.encode() + b">"


def test_a_chunk_ending_on_a_whole_secret_that_starts_no_longer_one_is_passed_at_once() -> None:
    """A secret complete at the chunk's end is replaced now, not held for the next chunk (an SSE event's last
    bytes reach the agent with their event); only a tail that could still grow into a longer secret waits."""
    scrubber = Scrubber([(OTHER, OTHER_PLACEHOLDER), (SECRET, PLACEHOLDER)])
    assert bytes(scrubber.feed(b"data: " + OTHER.encode())) == b"data: " + OTHER_PLACEHOLDER.encode()
    assert scrubber.replaced == 1 and scrubber.flush() == b""
