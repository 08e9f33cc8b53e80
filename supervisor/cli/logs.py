"""``openshell-sandbox logs [-f] [-n N] [--event KIND]... [--format human|json|ocsf]``: control's events.

Reads ``GET /v1/events`` on the operator API (found like every client command: ``--api``, else
``$OPENSHELL_SANDBOX_API``, else the only live socket), so it works the same against dev mode and a pod's
control. Prints the last N events (default 100), then with ``-f`` every new one until control goes away or
the user interrupts. ``--format human`` (the default): one line per event, its time, component and the OCSF
shorthand (``supervisor.cli.human.event_line``, terminal-safe); ``json`` (or ``--json``): the events' own JSON
lines; ``ocsf``: the OCSF 1.7.0 objects ``--log-format ocsf`` would have written, rendered here from those lines
(``supervisor/protocol/ocsf.py``). Exit 0, 125 when the API cannot be reached or refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from supervisor.cli.api_client import ApiError, add_api_arguments, find_api, stream_lines
from supervisor.cli.human import event_line
from supervisor.protocol.event_record import Event
from supervisor.protocol.ocsf import ocsf_lines

DEFAULT_TAIL = 100


def add_logs_parser(subparsers: Any) -> None:
    logs = subparsers.add_parser(
        "logs",
        help="show control's recent events (-f: then follow them)",
        description="Show the running sandbox's recent events from its control (GET /v1/events); -f follows.",
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new events as they come")
    logs.add_argument("-n", "--tail", type=int, default=DEFAULT_TAIL, help="how many recent events (default 100)")
    logs.add_argument(
        "--event",
        action="append",
        default=[],
        metavar="KIND",
        help="only events of this kind; 'egress' also matches 'egress.revoked' (repeatable)",
    )
    logs.add_argument(
        "--format", choices=["human", "json", "ocsf"], default="human",
        help="human (default): one line per event with the OCSF shorthand; json: the events' JSON lines; ocsf: "
        "OCSF 1.7.0 objects, one per line",
    )  # fmt: skip
    logs.add_argument("--json", action="store_true", help="the same as --format json")
    add_api_arguments(logs)


def events_target(tail: int, follow: bool, kinds: list[str]) -> str:
    query = [("tail", str(tail)), ("follow", "1" if follow else "0"), *(("event", kind) for kind in kinds)]
    return "/v1/events?" + urllib.parse.urlencode(query)


async def run_logs(args: argparse.Namespace) -> int:
    if args.tail < 0:
        raise ApiError(f"--tail must be 0 or more, got {args.tail}")
    api = find_api(args.api, args.cert)
    try:
        async for line in stream_lines(api, events_target(args.tail, args.follow, args.event)):
            text = render(line, "json" if args.json else args.format)
            if text is not None:
                print(text, flush=True)
    except BrokenPipeError:  # `logs -f | head`: the reader is done
        sys.stderr.close()
    return 0


def render(line: bytes, form: str) -> str | None:
    """One line of ``GET /v1/events`` as ``form`` prints it; ``None`` for what it cannot show."""
    if not line.strip():
        return None
    if form == "json":
        return line.decode("utf-8", "replace").rstrip("\n")
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    if form == "human":
        return event_line(raw)
    try:
        event = Event.from_wire(raw)
    except ValueError:
        return None  # a name this client does not know (a newer control): no OCSF mapping here
    return ocsf_lines(event).rstrip("\n")
