"""How events read for a person: terminal-safe text and one-line summaries (dev mode's stderr, ``logs``).

Rule: anything that may come from the workload's side — binary paths, host names, request paths, reasons
that quote them — is passed through :func:`clean` before it reaches a terminal. The agent names its own
executables; a name holding escape sequences must not be able to rewrite or hide the operator's screen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.ocsf import shorthand

DECISION_EVENTS = (EventName.EGRESS, EventName.EGRESS_REFUSED, EventName.HTTP, EventName.DNS)
_QUIET_FIELDS = ("time", "event", "component", "sandbox")
MAX_FIELDS_TEXT = 240


def clean(value: object) -> str:
    """``value`` as text safe for a terminal: every non-printable character escaped (``\\x1b``, ``\\n``)."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def format_size(size: int) -> str:
    """``size`` bytes for people: the largest binary unit that divides it, else MiB with one decimal."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size} bytes"


def summary(event: Mapping[str, Any]) -> str:
    """One line for ``openshell-sandbox logs``: time, component, event, then what matters for that event."""
    stamp = str(event.get("time", ""))
    clock = stamp[11:23] if len(stamp) >= 23 else stamp
    head = f"{clean(clock)}  {clean(event.get('component', '-')):<8} {clean(event.get('event', '?'))}"
    if str(event.get("event")) in DECISION_EVENTS:
        return f"{head}  {_decision(event)}"
    if event.get("event") == EventName.POLICY_GENERATION and isinstance(event.get("errors"), list):
        # every error of a quarantined (or retained) revision, whatever its length: it is what needs fixing
        errors = "; ".join(policy_error_text(error) for error in event["errors"])
        return clean(f"{head}  generation={event.get('generation')} status={event.get('status')}  {errors}")
    rest = {k: v for k, v in event.items() if k not in _QUIET_FIELDS}
    text = " ".join(f"{k}={_compact(v)}" for k, v in rest.items())
    if len(text) > MAX_FIELDS_TEXT:
        text = text[: MAX_FIELDS_TEXT - 1] + "…"
    return f"{head}  {clean(text)}" if text else head


def event_line(raw: Mapping[str, Any]) -> str:
    """One line for ``openshell-sandbox logs``: time, component, then the OCSF shorthand of docs/reference/policy.md
    §4.1 (``NET:OPEN [MED] DENIED python3(42) -> blocked.com:443 [reason:…]``); :func:`summary` for an event this
    client has no mapping for (a newer control's), and for a policy revision's errors, which are said whole as
    ``policy check`` says them (they are what needs fixing)."""
    if raw.get("event") == EventName.POLICY_GENERATION and isinstance(raw.get("errors"), list):
        return summary(raw)
    try:
        event = Event.from_wire(raw)
    except ValueError:
        return summary(raw)
    clock = event.time[11:23] if len(event.time) >= 23 else event.time
    return f"{clean(clock)}  {clean(event.component):<8} {clean(shorthand(event))}"


def policy_error_text(error: object) -> str:
    """A policy error's wire form as ``policy check`` prints it: ``FILE:LINE: PATH: message (expected ...)``."""
    if not isinstance(error, Mapping):
        return str(error)
    where = str(error.get("source") or "<policy>")
    if error.get("line") is not None:
        where += f":{error['line']}"
    text = f"{where}: {error.get('path') or '(top level)'}: {error.get('message', '?')}"
    return text + (f" (expected {error['expected']})" if error.get("expected") else "")


def _decision(event: Mapping[str, Any]) -> str:
    decision = event.get("decision") or ("refused" if event.get("event") == EventName.EGRESS_REFUSED else "?")
    if event.get("event") == EventName.DNS:
        target = f"DNS {event.get('name', '?')} {event.get('qtype', '')}".rstrip()
        who = ""
    else:
        target = str(event.get("destination") or "?")
        if event.get("method"):
            target = f"{event['method']} {target}{event.get('path') or ''}"
        who = f"{event.get('binary') or 'a process'} → "
    why = event.get("reason") or (f"rule {event['rule']}" if event.get("rule") else "")
    return clean(f"{decision} {who}{target}" + (f"  {why}" if why else ""))


def _compact(value: object) -> str:
    if isinstance(value, str):
        return value if value and " " not in value else json.dumps(value, ensure_ascii=False)
    return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)
