"""One daemon event, typed: what ``JsonLog.emit`` builds and every rendering reads (docs/design.md "Events").

An event is its time, its name (:class:`EventName`), the component that wrote it, the sandbox, and its own
fields as plain JSON values. The renderings are pure functions of it: :meth:`Event.json_line` (``--log-format
json``, the flat shape ``logs --format json`` and dev's events file carry), ``supervisor.protocol.ocsf``
(``--log-format ocsf``) and ``supervisor.protocol.shorthand`` (the human line). :meth:`Event.from_wire` reads a
JSON line back, so a client renders OCSF or the shorthand from control's ``GET /v1/events`` exactly as the daemon
would have.

Rules:

1. Field values are normalised once, when the event is built (:func:`plain`): JSON scalars stay, lists, tuples
   and dicts are walked, anything else is its ``str`` (a ``Path``, an address). A ``None`` field is dropped.
2. The four common keys (``time``, ``event``, ``component``, ``sandbox``) are not fields: a field spelled like
   one is dropped rather than let it overwrite them.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

from supervisor.protocol.event_names import EventName
from supervisor.protocol.json_value import JsonValue

__all__ = ["COMMON_KEYS", "Event", "FieldValue", "plain"]

FieldValue = Union[str, int, float, bool, None, list["FieldValue"], dict[str, "FieldValue"]]  # noqa: UP007
COMMON_KEYS = frozenset({"time", "event", "component", "sandbox"})


def plain(value: object) -> FieldValue:
    """``value`` as a JSON value (rule 1)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value  # a StrEnum member is a str and writes as its value
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


@dataclass(frozen=True, slots=True)
class Event:
    time: str  # RFC 3339, UTC, milliseconds
    name: EventName
    component: str
    sandbox: str | None
    fields: Mapping[str, FieldValue]

    @classmethod
    def build(cls, name: EventName, component: str, sandbox: str | None, /, **fields: object) -> Event:
        values = {k: plain(v) for k, v in fields.items() if v is not None and k not in COMMON_KEYS}
        return cls(now_rfc3339(), name, component, sandbox, values)

    @property
    def time_ms(self) -> int:
        """Milliseconds since the epoch (OCSF's ``time``)."""
        try:
            stamp = _dt.datetime.fromisoformat(self.time)
        except ValueError:
            return 0
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=_dt.UTC)
        return int(stamp.timestamp() * 1000)

    def to_wire(self) -> dict[str, JsonValue]:
        record: dict[str, JsonValue] = {"time": self.time, "event": str(self.name), "component": self.component}
        if self.sandbox is not None:
            record["sandbox"] = self.sandbox
        record.update(self.fields)
        return record

    def json_line(self) -> str:
        """The event as one JSON line, newline included (``--log-format json``)."""
        return json.dumps(self.to_wire(), separators=(",", ":"), ensure_ascii=False) + "\n"

    @classmethod
    def from_wire(cls, raw: Mapping[str, JsonValue]) -> Event:
        """An event from its JSON object; ``ValueError`` when it names no known event."""
        name = EventName(str(raw.get("event")))
        sandbox = raw.get("sandbox")
        fields = {k: plain(v) for k, v in raw.items() if k not in COMMON_KEYS}
        return cls(str(raw.get("time", "")), name, str(raw.get("component", "")),
                   None if sandbox is None else str(sandbox), fields)  # fmt: skip


def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
