"""The daemons' one event builder and where its lines go (docs/design.md "Events").

Both daemons use it, so it lives outside ``control`` and ``boundary``. :meth:`JsonLog.emit` builds one typed
:class:`~supervisor.protocol.event_record.Event` (``time``, ``event``, the emitting ``component``, ``sandbox``,
then flat keyword fields; values that are not JSON types become their ``str``) and renders it per ``--log-format``:
``json``, the flat JSON line, or ``ocsf``, OCSF 1.7.0 objects (``supervisor/protocol/ocsf.py``). A rendering is
written with a single ``write`` so lines from concurrent tasks never interleave.

Where lines go (docs/design.md "Events"): the stream (stdout in containers, ``--log-stream``) in the chosen format,
and also a file when one is given (``--log-file``: dev mode's ``events.jsonl``, which both daemons append to),
always as JSON: dev's terminal reads it. The file is opened ``O_APPEND`` (lines of the two daemons never
interleave), 0600, never through a symlink, and close-on-exec so no workload process inherits it.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event, now_rfc3339
from supervisor.protocol.ocsf import ocsf_lines

__all__ = ["JsonLog", "LogFormat", "now_rfc3339", "open_log_file"]

# Fields whose text the agent chooses, or that quote it, where it could spell a placeholder (a binary's name, a
# host, a path, a decision's explanation naming them).
_AGENT_TEXT = ("binary", "ancestors", "cmdline_paths", "destination", "path", "name", "reason", "detail")


class LogFormat(enum.StrEnum):
    """``--log-format``: how the stream's lines read."""

    JSON = "json"
    OCSF = "ocsf"


class JsonLog:
    def __init__(
        self,
        component: str,
        *,
        stream: TextIO | None = None,
        sandbox: str | None = None,
        file: TextIO | None = None,
        to_stream: bool = True,
        log_format: LogFormat = LogFormat.JSON,
    ) -> None:
        self.component = component
        self.sandbox = sandbox
        self._stream = stream
        self.file = file
        self.to_stream = to_stream
        self.log_format = log_format
        self.tap: Callable[[Event], None] | None = None  # control's event buffer (GET /v1/events)
        # the daemon's metrics and activity counters (supervisor/metrics.py): every event, once, as it is built
        self.sink: Callable[[Event], None] | None = None
        self.dropped = 0  # lines a stream or the file did not take (events dropped, on /metrics)
        # control's credentials: every placeholder spelling in agent-chosen text becomes [CREDENTIAL]
        self.scrub: Callable[[str], str] | None = None
        self.fields: dict[str, object] = {}  # on every event of this process (a control worker's ``worker``)

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def emit(self, event: EventName, **fields: object) -> None:
        scrub = self.scrub
        if scrub is not None:  # ``fields`` is this call's own dict: replaced in place, only where agent text is
            for key in _AGENT_TEXT:
                if key in fields:
                    fields[key] = _scrubbed(fields[key], scrub)
        if self.fields:
            fields = {**self.fields, **fields}
        self.forward(Event.build(event, self.component, self.sandbox, **fields))

    def forward(self, record: Event) -> None:
        """Record and write an event built already: by :meth:`emit`, or by another process of this daemon (a
        control worker's, scrubbed there)."""
        if self.tap is not None:
            self.tap(record)
        if self.sink is not None:
            self.sink(record)
        stream = self.stream if self.to_stream else None
        if stream is None and self.file is None:
            return
        json_line = record.json_line() if self.file is not None or self.log_format is LogFormat.JSON else ""
        self._write(stream, json_line if self.log_format is LogFormat.JSON else ocsf_lines(record))
        self._write(self.file, json_line)

    def _write(self, sink: TextIO | None, text: str) -> None:
        if sink is None:
            return
        try:
            sink.write(text)
            sink.flush()
        except (OSError, ValueError):
            self.dropped += 1  # the reader went away or the disk is full; logging must never take a daemon down


def _scrubbed(value: object, scrub: Callable[[str], str]) -> object:
    """An agent-text field's value with its text scrubbed: a string, or the strings of a list or tuple (which
    becomes a list); any other value is rendered by the event as it is."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list | tuple):
        return [scrub(v) if isinstance(v, str) else v for v in value]
    return value


def open_log_file(path: Path) -> TextIO:
    """Open ``path`` for appending JSON lines (created 0600; a symlink in its place is refused)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)
