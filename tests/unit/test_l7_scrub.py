"""The response scrubber (``l7.scrub``): a secret never reaches the agent, however the body is chunked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.control.l7.scrub import Scrubber

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
