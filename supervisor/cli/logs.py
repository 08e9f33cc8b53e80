"""``openshell-sandbox logs [-f] [-n N] [--event KIND]... [--json]``: control's events, from any control.

Reads ``GET /v1/events`` on the operator API (found like every client command: ``--api``, else
``$OPENSHELL_SANDBOX_API``, else the only live socket), so it works the same against dev mode and a pod's
control. Prints the last N events (default 100), then with ``-f`` every new one until control goes away or
the user interrupts. One human line per event by default (``supervisor.cli.human.summary``, terminal-safe), the
events' own JSON lines with ``--json``. Exit 0, 125 when the API cannot be reached or refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from supervisor.cli.api_client import ApiError, add_api_arguments, find_api, stream_lines
from supervisor.cli.human import summary

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
    logs.add_argument("--json", action="store_true", help="print the events' JSON lines")
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
            if not line.strip():
                continue
            if args.json:
                text = line.decode("utf-8", "replace")
            else:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                text = summary(event)
            print(text, flush=True)
    except BrokenPipeError:  # `logs -f | head`: the reader is done
        sys.stderr.close()
    return 0
