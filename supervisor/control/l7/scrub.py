"""A secret never flows back to the agent: responses from a credential's bound host carry its placeholder
wherever the origin echoed the secret (issue 14; beyond docs/reference/policy.md §3.13, which allows the echo).

Pure. :class:`Scrubber` replaces each secret's bytes by its placeholder in header values (:meth:`header`) and
in a body that arrives in chunks (:meth:`feed`, then :meth:`flush` at its end). A secret split across two
chunks is still caught: the last ``longest secret - 1`` bytes of a chunk are held back until the next one
shows whether they start a secret — so at most that many bytes are ever delayed, and nothing is reordered.

What it cannot see: a secret the origin transforms (compressed, base64- or percent-encoded) — the agent would
need to undo that transformation itself to read it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["Scrubber"]


class Scrubber:
    def __init__(self, secrets: Iterable[tuple[str, str]]) -> None:
        """``secrets``: ``(secret, placeholder)`` pairs; an empty secret is ignored."""
        self._swap = {s.encode("utf-8"): p.encode("utf-8") for s, p in secrets if s}
        ordered = sorted(self._swap, key=len, reverse=True)  # the longest first where one contains another
        self._pattern = re.compile(b"|".join(re.escape(s) for s in ordered)) if ordered else None
        self._keep = max((len(s) for s in ordered), default=1) - 1
        self._pending = b""
        self.replaced = 0

    def __bool__(self) -> bool:
        return self._pattern is not None

    def _replace(self, match: re.Match[bytes]) -> bytes:
        self.replaced += 1
        return self._swap[match.group(0)]

    def header(self, value: bytes) -> bytes:
        return value if self._pattern is None else self._pattern.sub(self._replace, value)

    def feed(self, data: bytes | bytearray) -> bytes | bytearray | memoryview:
        """What of ``data`` (after what was held back) can go to the agent now. A chunk with nothing to replace is
        copied once (into the buffer scanned) and handed on as a view of it: a download is not copied per step."""
        if self._pattern is None:
            return data
        buffer = self._pending + data  # bytes: ``_pending`` is
        safe = len(buffer) - self._keep  # a secret starting before ``safe`` lies wholly inside ``buffer``
        out: list[bytes] = []
        at = 0
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

    def flush(self) -> bytes:
        """The end of the body: what was held back, scrubbed."""
        rest, self._pending = self._pending, b""
        return self.header(rest)
