"""A secret never flows back to the agent: every part of a response from a credential's bound host that the agent
reads carries the placeholder wherever the origin echoed the secret (docs/policy.md "A secret never flows back";
beyond docs/reference/policy.md §3.13, which allows the echo).

Pure. :class:`Scrubber` replaces each secret's bytes by its placeholder in the status line's reason phrase
(:meth:`reason`), header values (:meth:`header`), header names (:meth:`name`) and in a body that arrives in chunks
(:meth:`feed`, then :meth:`flush` at its end). A secret split across two chunks is still caught: a chunk's tail that
could be the start of a secret (the longest suffix that is a proper prefix of one, at most ``longest secret - 1``
bytes) is held back until the next chunk shows whether it is; every other byte goes on at once, so a chunk that
ends as no secret begins (an SSE event's blank line) is passed whole, and nothing is reordered.

Header names are matched without regard to case (HTTP names are case-insensitive and intermediaries fold them);
a name with a placeholder in it is usually no longer a valid token — :meth:`name` returns it all the same and the
caller refuses the response (:func:`valid_name`).

What it cannot see: a secret the origin transforms (compressed, base64- or percent-encoded) — the agent would
need to undo that transformation itself to read it — and a secret the agent rebuilds from responses that each hold
a piece of it. The session closes the generic forms of both (``Range`` stripped, ``206`` refused, identity
encoding asked for, compressed responses refused); docs/policy.md lists what remains.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["Scrubber", "bound_request_headers", "unscrubbable", "valid_name"]

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
# a slice of a representation (a secret rebuilt from pieces) and a compressed one (a secret the scrubber cannot
# see) are never asked for from a bound host; what the agent asked for in their place is dropped
_NOT_ASKED = frozenset({b"range", b"if-range", b"accept-encoding"})


def valid_name(name: bytes) -> bool:
    """Whether ``name`` is an RFC 9110 token, as a header name must be (h11 refuses any other)."""
    return _TOKEN.fullmatch(name) is not None


def bound_request_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A request's headers toward a host a credential is bound to: no ``Range``/``If-Range`` (the origin sends the
    whole representation, scrubbed whole) and ``Accept-Encoding: identity`` (a body the scrubber can read)."""
    kept = [(n, v) for n, v in headers if n.lower() not in _NOT_ASKED]
    kept.append((b"Accept-Encoding", b"identity"))
    return kept


def unscrubbable(status: int, headers: Iterable[tuple[bytes, bytes]], *, has_body: bool) -> str | None:
    """Why a final response from a bound host cannot be passed on scrubbed (``None``: it can): a ``206`` slice
    (pieces that rebuild a secret none of them holds whole) or a body in a content coding (a secret compressed)."""
    if status == 206:
        return "a 206 partial response (a slice of a representation)"
    if not has_body:
        return None
    for name, value in headers:
        if name.lower() != b"content-encoding":
            continue
        if {c.strip().lower() for c in value.split(b",")} - {b"", b"identity"}:
            return "a body in a content coding (Content-Encoding), which the scrubber cannot read"
    return None


class Scrubber:
    def __init__(self, secrets: Iterable[tuple[str, str]]) -> None:
        """``secrets``: ``(secret, placeholder)`` pairs; an empty secret is ignored."""
        self._swap = {s.encode("utf-8"): p.encode("utf-8") for s, p in secrets if s}
        ordered = sorted(self._swap, key=len, reverse=True)  # the longest first where one contains another
        self._ordered = ordered
        self._pattern = re.compile(b"|".join(re.escape(s) for s in ordered)) if ordered else None
        self._folded = {s.lower(): p for s, p in self._swap.items()}
        self._any_case = re.compile(self._pattern.pattern, re.IGNORECASE) if self._pattern is not None else None
        self._keep = max((len(s) for s in ordered), default=1) - 1
        self._firsts = sorted({s[:1] for s in ordered})
        self._pending = b""
        self.replaced = 0

    def __bool__(self) -> bool:
        return self._pattern is not None

    def _replace(self, match: re.Match[bytes]) -> bytes:
        self.replaced += 1
        return self._swap[match.group(0)]

    def _replace_folded(self, match: re.Match[bytes]) -> bytes:
        self.replaced += 1
        return self._folded[match.group(0).lower()]

    def header(self, value: bytes) -> bytes:
        """A header value (or any whole piece of text): each secret becomes its placeholder."""
        return value if self._pattern is None else self._pattern.sub(self._replace, value)

    def reason(self, phrase: bytes) -> bytes:
        """The status line's reason phrase (a placeholder is a valid one: visible ASCII)."""
        return self.header(phrase)

    def name(self, name: bytes) -> bytes:
        """A header name, each secret in any case replaced; check the result with :func:`valid_name`."""
        return name if self._any_case is None else self._any_case.sub(self._replace_folded, name)

    def feed(self, data: bytes | bytearray) -> bytes | bytearray | memoryview:
        """What of ``data`` (after what was held back) can go to the agent now. A chunk with nothing to replace is
        copied once (into the buffer scanned) and handed on as a view of it: a download is not copied per step."""
        if self._pattern is None:
            return data
        buffer = self._pending + data  # bytes: ``_pending`` is
        safe = len(buffer) - self._held(buffer)  # every secret starting before ``safe`` lies wholly inside ``buffer``
        out: list[bytes] = []
        at = 0
        # A body is the hot path and a secret in it the rare case: one ``bytes.find`` per secret scans a chunk several
        # times faster than ``re`` walks the alternation (the gap grows with each secret), so the alternation runs
        # only on a chunk that holds one.
        if any(secret in buffer for secret in self._ordered):
            for match in self._pattern.finditer(buffer):
                if match.start() >= safe:
                    break
                out += (buffer[at : match.start()], self._replace(match))
                at = match.end()
        cut = max(at, safe)
        self._pending = buffer[cut:]
        if not out:
            return memoryview(buffer)[:cut]
        out.append(buffer[at:cut])
        return b"".join(out)

    def _held(self, buffer: bytes) -> int:
        """The length of ``buffer``'s longest suffix that is a proper prefix of a secret: only those bytes may be
        the start of a secret the next chunk completes (a longer suffix would be a longer prefix, hence found)."""
        best = len(buffer)
        for first in self._firsts:  # the leftmost candidate of each first byte that fits gives the longest suffix
            at = buffer.find(first, max(0, len(buffer) - self._keep))
            while 0 <= at < best:
                tail = buffer[at:]
                if any(len(s) > len(tail) and s.startswith(tail) for s in self._swap):
                    best = at
                    break
                at = buffer.find(first, at + 1)
        return len(buffer) - best

    def flush(self) -> bytes:
        """The end of the body: what was held back, scrubbed."""
        rest, self._pending = self._pending, b""
        return self.header(rest)
