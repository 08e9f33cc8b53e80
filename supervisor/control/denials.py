"""Denials aggregated for the policy advisor (docs/reference/policy.md §4.2, docs/policy.md "Suggesting a policy").

Control feeds every event it logs to :meth:`DenialTable.observe` (the same tap as the event buffer); ``policy
suggest --events FILE`` feeds the lines of a kept events file to a table of its own, so both read denials the same
way. Served at ``GET /v1/denials``.

Rules:

1. A denial is an ``egress`` event with ``decision: deny``, an ``http`` event with ``decision: deny``, or (from an
   events file, which holds the boundary's lines too) the boundary's refusals. Nothing else is read.
2. Entries are keyed by (host, port, binary) and keep the count, first and last seen, the stage and reason of the
   latest denial, the ancestors, the rule and endpoint an L7 denial was judged under, and up to ``MAX_SAMPLES``
   distinct L7 samples (method, query-free redacted path, the operation of an MCP, JSON-RPC or GraphQL call) with
   their counts. The strings are those of the events: already redacted (``[CREDENTIAL]``, no query).
3. Bounded (docs/design.md "Bounded tables"): at most ``MAX_ENTRIES`` entries (the least recently seen goes, and
   ``evicted`` counts it), ``MAX_SAMPLES`` samples per entry (``samples_dropped`` counts the rest), strings cut to
   ``MAX_TEXT`` characters with ``truncated`` set (a truncated entry is never proposed: its text is not what the
   agent asked for). No decision reads this table.
4. The stage (§4.2's catalogue, as this project spells it): ``ssrf`` for a refusal of the destination's address,
   ``bypass`` for a refusal at the boundary before control's policy (no identity, no link), ``l7`` for an inspected
   request, ``connect-l7-parse-rejection`` for one refused before policy, ``connect-tls-termination-unavailable``,
   ``forward`` / ``transparent-tcp`` / ``connect`` for an L4 denial by how the connection was captured.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event, FieldValue
from supervisor.protocol.json_value import JsonValue, is_json_object
from supervisor.protocol.outcome_reasons import OutcomeReason
from supervisor.protocol.upstream_reasons import UpstreamReason

__all__ = ["DenialEntry", "DenialTable", "L7Sample", "Stage", "stage_of"]

MAX_ENTRIES: Final = 1024
MAX_SAMPLES: Final = 20
MAX_TEXT: Final = 1024
MAX_ANCESTORS: Final = 8


class Stage:
    """The denial stages (rule 4)."""

    CONNECT: Final = "connect"
    FORWARD: Final = "forward"
    TRANSPARENT: Final = "transparent-tcp"
    SSRF: Final = "ssrf"
    TLS_UNAVAILABLE: Final = "connect-tls-termination-unavailable"
    L7: Final = "l7"
    L7_PARSE: Final = "connect-l7-parse-rejection"
    BYPASS: Final = "bypass"


_SSRF_REASONS: Final = frozenset(str(r) for r in UpstreamReason if r.ssrf or r is UpstreamReason.INVALID_HOST)

# the L7 reasons a rule in ``rules`` could change; every other http denial (authority or credential mismatch, a
# malformed request, an explicit deny rule) is not the advisor's to lift
L7_PROPOSABLE: Final = frozenset({"l7-no-allow-rule", "l7-no-endpoint-path"})
_L7_POLICY_REASONS: Final = frozenset({"l7-denied", "l7-no-allow-rule", "l7-no-endpoint-path", "body-invalid",
                                       "body-too-large", "persisted-query-unregistered", "response-frame"})  # fmt: skip


def stage_of(event: Event, refusals: frozenset[EventName] = frozenset()) -> str | None:
    """The stage of a denial event, or None when ``event`` is not a denial (rule 1). ``refusals``: the boundary's
    refusal events, which only an events file holds (the reader passes them: control never sees them)."""
    fields = event.fields
    if event.name in refusals:
        return Stage.BYPASS
    if fields.get("decision") != "deny":
        return None
    reason = str(fields.get("reason") or "")
    if event.name is EventName.HTTP:
        return Stage.L7 if reason in _L7_POLICY_REASONS else Stage.L7_PARSE
    if event.name is not EventName.EGRESS:
        return None
    if reason in _SSRF_REASONS:
        return Stage.SSRF
    if reason == OutcomeReason.L7_INSPECTION_UNAVAILABLE:
        return Stage.TLS_UNAVAILABLE
    capture = fields.get("capture")
    return {"http-forward": Stage.FORWARD, "transparent": Stage.TRANSPARENT}.get(str(capture), Stage.CONNECT)


@dataclass
class L7Sample:
    method: str
    path: str
    operation: str | None
    count: int = 0

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"method": self.method, "path": self.path, "count": self.count}
        if self.operation is not None:
            body["operation"] = self.operation
        return body


@dataclass
class DenialEntry:
    host: str
    port: int
    binary: str | None
    stage: str
    reason: str
    first_seen_ms: int
    last_seen_ms: int
    count: int = 0
    ancestors: list[str] = field(default_factory=list)
    loader_env: list[str] = field(default_factory=list)
    rule: str | None = None  # an L7 denial's rule and endpoint ("api[0]"): where an allow rule would go
    endpoint: str | None = None
    samples: dict[tuple[str, str, str | None], L7Sample] = field(default_factory=dict)
    samples_dropped: int = 0
    truncated: bool = False

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {
            "host": self.host, "port": self.port, "binary": self.binary, "ancestors": list(self.ancestors),
            "denial_stage": self.stage, "deny_reason": self.reason, "count": self.count,
            "first_seen_ms": self.first_seen_ms, "last_seen_ms": self.last_seen_ms,
            "l7_samples": [s.to_json() for s in self.samples.values()],
        }  # fmt: skip
        for key in ("rule", "endpoint"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        if self.loader_env:
            body["loader_env"] = list(self.loader_env)
        if self.samples_dropped:
            body["samples_dropped"] = self.samples_dropped
        if self.truncated:
            body["truncated"] = True
        return body

    @classmethod
    def from_json(cls, raw: dict[str, JsonValue]) -> DenialEntry:
        """An entry as ``GET /v1/denials`` serves it (``TypeError``/``ValueError``/``KeyError`` when malformed)."""
        entry = cls(
            host=str(raw["host"]), port=_int(raw["port"]),
            binary=None if raw.get("binary") is None else str(raw["binary"]),
            stage=str(raw["denial_stage"]), reason=str(raw["deny_reason"]), first_seen_ms=_int(raw["first_seen_ms"]),
            last_seen_ms=_int(raw["last_seen_ms"]), count=_int(raw["count"]),
            ancestors=[str(a) for a in _items(raw.get("ancestors"))],
            loader_env=[str(v) for v in _items(raw.get("loader_env"))],
            rule=None if raw.get("rule") is None else str(raw["rule"]),
            endpoint=None if raw.get("endpoint") is None else str(raw["endpoint"]),
            samples_dropped=_int(raw.get("samples_dropped", 0)), truncated=bool(raw.get("truncated", False)),
        )  # fmt: skip
        for s in _items(raw.get("l7_samples")):
            if not is_json_object(s):
                raise TypeError(f"an l7 sample is not an object: {s!r}")
            op = s.get("operation")
            sample = L7Sample(str(s["method"]), str(s["path"]), None if op is None else str(op), _int(s["count"]))
            entry.samples[(sample.method, sample.path, sample.operation)] = sample
        return entry


def _int(value: JsonValue) -> int:
    """``int(value)`` for what a JSON number or numeric string can be; ``TypeError`` for the rest, as ``int``."""
    if isinstance(value, str | int | float):
        return int(value)
    raise TypeError(f"not a number: {value!r}")


def _items(value: JsonValue) -> list[JsonValue]:
    """A list field that may be absent or null (no items)."""
    if not value:
        return []
    if isinstance(value, list):
        return value
    raise TypeError(f"not a list: {value!r}")


def _cut(text: str) -> tuple[str, bool]:
    return (text, False) if len(text) <= MAX_TEXT else (text[:MAX_TEXT], True)


def _destination(fields: Mapping[str, FieldValue]) -> tuple[str, int] | None:
    destination = fields.get("destination")
    if not isinstance(destination, str):
        return None
    host, sep, port = destination.rpartition(":")
    if not sep or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class DenialTable:
    """The bounded aggregation of rules 1-3. ``observe`` may be called from any thread (JsonLog's tap)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, *, refusals: frozenset[EventName] = frozenset()) -> None:
        self._refusals = refusals
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int, str | None], DenialEntry] = OrderedDict()
        self._max = max_entries
        self.evicted = 0

    def observe(self, event: Event) -> None:
        stage = stage_of(event, self._refusals)
        if stage is None:
            return
        fields = event.fields
        where = _destination(fields)
        if where is None:
            return
        host, port = where
        binary = fields.get("binary")
        binary = binary if isinstance(binary, str) else None
        now = event.time_ms
        truncated = False
        host, cut = _cut(host)
        truncated |= cut
        if binary is not None:
            binary, cut = _cut(binary)
            truncated |= cut
        key = (host, port, binary)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = DenialEntry(host, port, binary, stage, "", now, now)
                self._entries[key] = entry
                if len(self._entries) > self._max:
                    self._entries.popitem(last=False)
                    self.evicted += 1
            else:
                self._entries.move_to_end(key)
            entry.count += 1
            entry.last_seen_ms = max(entry.last_seen_ms, now)
            entry.first_seen_ms = min(entry.first_seen_ms, now)
            entry.stage = stage
            entry.reason = str(fields.get("reason") or "")[:200]
            entry.truncated |= truncated
            ancestors = fields.get("ancestors")
            if isinstance(ancestors, list) and ancestors:
                cut_all = [_cut(str(a)) for a in ancestors[:MAX_ANCESTORS]]
                entry.ancestors = [a for a, _ in cut_all]
            loader = fields.get("loader_env")
            if isinstance(loader, list):
                entry.loader_env = sorted({str(v)[:64] for v in loader[:8]} | set(entry.loader_env))[:8]
            if event.name is EventName.HTTP:
                self._sample(entry, fields)

    @staticmethod
    def _sample(entry: DenialEntry, fields: Mapping[str, FieldValue]) -> None:
        rule, endpoint = fields.get("rule"), fields.get("endpoint")
        entry.rule = rule[:MAX_TEXT] if isinstance(rule, str) else None
        entry.endpoint = endpoint[:MAX_TEXT] if isinstance(endpoint, str) else None
        method, path, operation = fields.get("method"), fields.get("path"), fields.get("operation")
        if not isinstance(method, str) or not isinstance(path, str):
            return
        method, cut_m = _cut(method)
        path, cut_p = _cut(path)
        op: str | None = None
        cut_o = False
        if isinstance(operation, str):
            op, cut_o = _cut(operation)
        key = (method, path, op)
        sample = entry.samples.get(key)
        if sample is None:
            if len(entry.samples) >= MAX_SAMPLES:
                entry.samples_dropped += 1
                return
            if cut_m or cut_p or cut_o:
                entry.truncated = True
            sample = entry.samples[key] = L7Sample(method, path, op)
        sample.count += 1

    def entries(self, since_ms: int | None = None) -> list[DenialEntry]:
        """The entries last seen at or after ``since_ms`` (all when None), oldest first."""
        with self._lock:
            chosen = [e for e in self._entries.values() if since_ms is None or e.last_seen_ms >= since_ms]
            return sorted(chosen, key=lambda e: (e.first_seen_ms, e.host, e.port, e.binary or ""))

    def to_json(self, since_ms: int | None = None) -> dict[str, JsonValue]:
        return {"denials": [e.to_json() for e in self.entries(since_ms)], "evicted": self.evicted}
