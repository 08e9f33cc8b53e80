"""One JSON object per line: the daemons' log and event format (docs/design.md "Events").

Both daemons use it, so it lives outside ``control`` and ``boundary``. Every line has ``time`` (RFC 3339, UTC,
milliseconds), ``event`` and the emitting ``component``; everything else is flat keyword fields. Values that
are not JSON types are rendered with ``str``. A line is written with a single ``write`` so lines from
concurrent tasks never interleave.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from typing import Any, TextIO


class JsonLog:
    def __init__(self, component: str, *, stream: TextIO | None = None, sandbox: str | None = None) -> None:
        self.component = component
        self.sandbox = sandbox
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def emit(self, event: str, **fields: Any) -> None:
        record: dict[str, Any] = {"time": now_rfc3339(), "event": event, "component": self.component}
        if self.sandbox is not None:
            record["sandbox"] = self.sandbox
        record.update({k: v for k, v in fields.items() if v is not None})
        line = json.dumps(record, default=str, separators=(",", ":"), ensure_ascii=False)
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # the reader went away; logging must never take a daemon down


def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
