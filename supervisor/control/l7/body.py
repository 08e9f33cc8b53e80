"""What the body evaluators of the agent's own protocols (``jsonrpc``, ``mcp``, ``graphql``) read: one request,
body buffered whole, and the one dispatch from a :class:`~supervisor.control.policy.BodyRoute` to its evaluator.

Pure. The evaluators never see a credential (the body is read before any rewrite, and they log no argument,
variable or parameter: those may hold secrets); what they report of a call is :func:`label`-bounded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from supervisor.control.policy import BodyRoute, Decision, DenyReason, Verdict

__all__ = ["BodyRefused", "BodyRequest", "label", "strict_json"]

MAX_LABEL = 128


@dataclass(frozen=True, slots=True)
class BodyRequest:
    """One request as its evaluator sees it: the HTTP method, the (undecoded) query string, the media type of
    ``Content-Type`` (lower-case, parameters dropped; ``None`` when absent), whether any ``Content-Encoding``
    other than ``identity`` was sent, and the whole body."""

    method: str
    query: str | None
    content_type: str | None
    encoded: bool
    body: bytes


class BodyRefused(ValueError):
    """The body cannot be judged as the server would read it: a hard deny, whatever the enforcement."""


def label(text: str) -> str:
    """An agent-chosen name (method, tool, operation), safe for an event: printable, at most 128 characters."""
    shown = "".join(c if c.isprintable() else "?" for c in text[:MAX_LABEL])
    return shown + ("…" if len(text) > MAX_LABEL else "")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # two "method" keys: one server takes the first, another the last; we cannot know which
            raise BodyRefused(f"duplicate JSON key {label(key)!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise BodyRefused(f"JSON has no {name}")


def strict_json(data: bytes) -> Any:
    """JSON as every server reads it alike: UTF-8 without a BOM, no duplicate keys, no NaN/Infinity."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyRefused("body is not UTF-8") from None
    if text.startswith("\ufeff"):
        raise BodyRefused("body starts with a byte-order mark")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise BodyRefused("JSON nested too deeply") from None
    except ValueError as exc:  # BodyRefused is one too
        if isinstance(exc, BodyRefused):
            raise
        raise BodyRefused(f"malformed JSON: {exc.args[0] if exc.args else exc}"[:200]) from None


def refused(route: BodyRoute, why: str, *, reason: DenyReason = DenyReason.BODY_INVALID,
            operation: str | None = None) -> Decision:  # fmt: skip
    """The hard deny of a body that cannot be judged (§3.10.4)."""
    return route.decision(Verdict.DENY, reason, f"{route.protocol} request rejected: {why}", hard=True,
                          operation=operation)  # fmt: skip
