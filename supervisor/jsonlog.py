"""One JSON object per line: the daemons' log and event format (docs/design.md "Events").

Both daemons use it, so it lives outside ``control`` and ``boundary``. Every line has ``time`` (RFC 3339, UTC,
milliseconds), ``event`` and the emitting ``component``; everything else is flat keyword fields. Values that
are not JSON types are rendered with ``str``. A line is written with a single ``write`` so lines from
concurrent tasks never interleave.

Where lines go (docs/design.md "Events"): the stream (stdout in containers, ``--log-stream``), and also a
file when one is given (``--log-file``: dev mode's ``events.jsonl``, which both daemons append to). The file
is opened ``O_APPEND`` (lines of the two daemons never interleave), 0600, never through a symlink, and
close-on-exec so no workload process inherits it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from supervisor.protocol.event_names import EventName


class JsonLog:
    def __init__(
        self,
        component: str,
        *,
        stream: TextIO | None = None,
        sandbox: str | None = None,
        file: TextIO | None = None,
        to_stream: bool = True,
    ) -> None:
        self.component = component
        self.sandbox = sandbox
        self._stream = stream
        self.file = file
        self.to_stream = to_stream
        self.tap: Callable[[dict[str, Any]], None] | None = None  # control's event buffer (GET /v1/events)

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def emit(self, event: EventName, **fields: Any) -> None:
        record: dict[str, Any] = {"time": now_rfc3339(), "event": event, "component": self.component}
        if self.sandbox is not None:
            record["sandbox"] = self.sandbox
        record.update({k: v for k, v in fields.items() if v is not None})
        if self.tap is not None:
            self.tap(record)
        line = json.dumps(record, default=str, separators=(",", ":"), ensure_ascii=False) + "\n"
        for sink in (self.stream if self.to_stream else None, self.file):
            if sink is None:
                continue
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):
                pass  # the reader went away or the disk is full; logging must never take a daemon down


def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def open_log_file(path: Path) -> TextIO:
    """Open ``path`` for appending JSON lines (created 0600; a symlink in its place is refused)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)
