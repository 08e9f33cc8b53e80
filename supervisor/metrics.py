"""``/metrics`` for either daemon: Prometheus's exposition format on ``--metrics-listen`` (docs/design.md "Metrics").

Both daemons use it, so it lives outside ``control`` and ``boundary`` (as ``jsonlog.py`` does). Each daemon keeps
its own registry (``supervisor/control/metrics.py``, ``supervisor/boundary/metrics.py``): counters moved by a sink
on its :class:`~supervisor.jsonlog.JsonLog` — one place that sees every event — and gauges read from the daemon's
state when Prometheus scrapes.

Rules:

1. A label value comes only from a closed set (:func:`closed`): a decision, a catalogue's reason, a §4.3 deny
   group, a protocol, an event name, the daemon, or a rule key of the policy in force. What the agent chooses — a
   host, a port, a method, a path, a binary, an SNI, a tool or model name — is never a label, so no amount of
   agent traffic adds a series (tests/unit/test_metrics.py floods them).
2. The listener serves ``GET /metrics`` only, one request per connection, its head within
   :data:`HEAD_TIMEOUT_S` and at most :data:`MAX_HEAD` bytes; anything else is ``404``/``405``/``400``.
3. It listens where the operator says and nowhere else; ``*`` is every address. It is never in the agent's
   network namespace (docs/design.md "Metrics" says who can reach it in each mode).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, disable_created_metrics, generate_latest

__all__ = ["NONE_LABEL", "OTHER", "PATH", "MetricsServer", "closed"]

OTHER = "other"  # the label of any value outside its closed set
NONE_LABEL = "-"  # the label where the event gives no value (a deny's rule, an allow's reason)
HEAD_TIMEOUT_S = 10.0
MAX_HEAD = 8192
PATH = "/metrics"

# No ``*_created`` twin of every counter: a series per label set is what an operator pays for, and a counter's
# start is the daemon's, which ``process_start_time_seconds``-style gauges would say better (none is needed here).
disable_created_metrics()  # type: ignore[no-untyped-call]


def closed(value: object, allowed: Collection[str], default: str = OTHER) -> str:
    """``value`` as a label when it is one of ``allowed``, else ``default`` (rule 1)."""
    text = value if isinstance(value, str) else None
    return text if text is not None and text in allowed else default


class MetricsServer:
    """Serves one registry's ``/metrics`` over plain HTTP/1.1 (h11, on trio like the rest of the daemon)."""

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, *, before_scrape: Callable[[], None] | None = None
    ) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.before_scrape = before_scrape
        self.bound: tuple[str, int] | None = None

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, then report ``ADDR:PORT`` as bound (the daemon's ``metrics.listening`` event says it)."""
        listeners = await trio.open_tcp_listeners(self.port, host=None if self.host == "*" else self.host)
        name = listeners[0].socket.getsockname()
        self.bound = (str(name[0]), int(name[1]))
        task_status.started(f"{self.host}:{self.bound[1]}")
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        try:
            with trio.move_on_after(HEAD_TIMEOUT_S):
                request = await _next_request(stream, conn)
                if request is None:
                    return
                status, body, content_type = self._answer(request)
                headers = [("content-type", content_type), ("content-length", str(len(body))),
                           ("connection", "close")]  # fmt: skip
                data = conn.send(h11.Response(status_code=status, headers=headers))
                data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
                await stream.send_all(data)
        except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    def _answer(self, request: h11.Request) -> tuple[int, bytes, str]:
        target = request.target.decode("ascii", "replace").split("?", 1)[0]
        if target != PATH:
            return 404, b"not found: only /metrics is served here\n", "text/plain; charset=utf-8"
        if request.method != b"GET":
            return 405, b"method not allowed\n", "text/plain; charset=utf-8"
        if self.before_scrape is not None:
            self.before_scrape()
        return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST


async def _next_request(stream: trio.SocketStream, conn: h11.Connection) -> h11.Request | None:
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            return event
        if event is h11.NEED_DATA:
            data = await stream.receive_some(MAX_HEAD)
            if not data:
                return None
            conn.receive_data(bytes(data))
            continue
        return None
