"""``openshell-sandbox policy suggest``: the next policy revision, written from what was denied (docs/policy.md
"Suggesting a policy").

* Against a running sandbox: ``policy suggest [--since T] [--out FILE] [--api …]`` reads ``GET /v1/denials`` (the
  denials control aggregated, the policy in force, the paths the agent can write).
* After it ended: ``policy suggest --events FILE [--policy POLICY] [--since T] [--out FILE]`` aggregates the kept
  events file the same way (``supervisor/control/denials.py``); the policy in force is ``--policy`` (dev's exit line
  names it), else the embedded deny-all default; the writable paths are the agent's filesystem event's
  ``read_write`` plus ``/tmp`` and ``/dev/shm``.

The revision (``supervisor/control/advisor.py``) is checked as ``policy check`` would before anything is written,
then written as YAML to ``--out`` (else stdout) and shown as a unified diff against the policy in force (on stdout
with ``--out``, else on stderr), with what was generalised and what was not proposed, and why, on stderr. Nothing is
applied: ``policy apply FILE`` stays a separate, explicit step. Exit 0 when something is proposed, 1 when nothing
is, 2 for a usage error, 125 when the API or a file cannot be read.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import difflib
import json
import os
import re
from pathlib import Path
from typing import Any, TextIO

from supervisor.cli.human import clean
from supervisor.control.advisor import Suggestion, render, suggest
from supervisor.control.denials import DenialEntry, DenialTable
from supervisor.control.policy import Policy, PolicyInvalid, load_default_policy, load_policy_file, load_policy_text
from supervisor.control.policy.watch_safety import DEFAULT_AGENT_WRITABLE
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.exit_codes import ExitCode

__all__ = ["add_suggest_parser", "parse_since", "run_suggest", "suggest_hint"]

_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_suggest_parser(sub: Any) -> None:
    from supervisor.cli.api_client import add_api_arguments

    suggest_parser = sub.add_parser(
        "suggest",
        help="write the policy revision that would allow what was denied (never applied)",
        description="Write a revision of the policy in force that allows exactly what was denied — from the running "
        "sandbox, or from a kept events file — checked, and shown as a diff. Apply it with `policy apply FILE`.",
    )
    suggest_parser.add_argument("--since", metavar="T", help="only denials seen since T: an RFC 3339 time or a "
                                "duration ago (30s, 10m, 2h, 1d)")  # fmt: skip
    suggest_parser.add_argument("--out", type=Path, metavar="FILE", help="write the YAML here (default stdout)")
    suggest_parser.add_argument("--events", type=Path, metavar="FILE",
                                help="read a kept events file (dev's events.jsonl), not a running sandbox")  # fmt: skip
    suggest_parser.add_argument("--policy", type=Path, metavar="FILE",
                                help="with --events: the policy in force (default the embedded deny-all)")  # fmt: skip
    add_api_arguments(suggest_parser)


def parse_since(text: str, now: _dt.datetime | None = None) -> int:
    """Milliseconds since the epoch for ``--since``; ``ValueError`` when it is neither a time nor a duration."""
    now = now or _dt.datetime.now(_dt.UTC)
    match = _DURATION.fullmatch(text.strip())
    if match is not None:
        return int((now.timestamp() - int(match.group(1)) * _UNIT[match.group(2)]) * 1000)
    stamp = _dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=_dt.UTC)
    return int(stamp.timestamp() * 1000)


def run_suggest(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        since = None if args.since is None else parse_since(args.since)
    except ValueError:
        print(f"policy suggest: --since {clean(args.since)}: expected an RFC 3339 time or 30s, 10m, 2h, 1d", file=err)
        return ExitCode.USAGE
    if args.policy is not None and args.events is None:
        print("policy suggest: --policy goes with --events (a running sandbox says its own policy)", file=err)
        return ExitCode.USAGE
    try:
        source = _from_events(args, since) if args.events is not None else _from_api(args, since)
    except _Failed as exc:
        print(f"policy suggest: {exc}", file=err)
        return exc.code
    policy, entries, writable, label = source
    result = suggest(policy, entries, writable)
    return _write(args, policy, result, label, out, err)


class _Failed(Exception):
    def __init__(self, message: str, code: int = ExitCode.SELF_FAILED) -> None:
        super().__init__(message)
        self.code = code


Source = tuple[Policy, list[DenialEntry], list[str], str]


def _from_api(args: argparse.Namespace, since: int | None) -> Source:
    import trio

    from supervisor.cli.api_client import ApiError, find_api, request_json

    target = "/v1/denials" + ("" if since is None else f"?since={since}")
    try:
        status, body = trio.run(request_json, find_api(args.api, args.cert), "GET", target)
    except ApiError as exc:
        raise _Failed(str(exc)) from None
    if status != 200:
        raise _Failed(str(body.get("reason") or f"HTTP {status}"))
    try:
        policy = load_policy_text(json.dumps(body["policy"]), "the policy in force")
        entries = [DenialEntry.from_json(raw) for raw in body["denials"]]
        writable = [*DEFAULT_AGENT_WRITABLE, *(str(p) for p in body.get("agent_writable") or [])]
    except (KeyError, TypeError, ValueError, PolicyInvalid) as exc:
        raise _Failed(f"unexpected /v1/denials answer: {exc}") from None
    return policy, entries, writable, f"policy in force (generation {body.get('policy_generation')})"


def _from_events(args: argparse.Namespace, since: int | None) -> Source:
    try:
        policy = load_policy_file(args.policy) if args.policy is not None else load_default_policy()
    except PolicyInvalid as exc:
        raise _Failed(f"{args.policy} is not a valid policy: {exc.errors[0]}", ExitCode.USAGE) from None
    except OSError as exc:
        raise _Failed(f"{args.policy}: cannot read: {exc.strerror}") from None
    table = DenialTable(refusals=frozenset({EventName.EGRESS_REFUSED}))
    writable = list(DEFAULT_AGENT_WRITABLE)
    try:
        with open(args.events, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    event = Event.from_wire(json.loads(line))
                except (ValueError, TypeError, AttributeError):
                    continue  # a line cut by a full disk, or another program's
                if event.name is EventName.AGENT_FILESYSTEM:
                    read_write = event.fields.get("read_write")
                    writable += [str(p) for p in read_write] if isinstance(read_write, list) else []
                table.observe(event)
    except OSError as exc:
        raise _Failed(f"{args.events}: cannot read: {exc.strerror}") from None
    label = str(args.policy) if args.policy is not None else "the embedded default policy"
    return policy, table.entries(since), writable, label


def _write(args: argparse.Namespace, policy: Policy, result: Suggestion, label: str, out: TextIO, err: TextIO) -> int:
    for line in result.generalised:
        print(f"generalised: {clean(line)}", file=err)
    for what, why in result.refused:
        print(f"not proposed: {clean(what)}: {clean(why)}", file=err)
    if not result.changed:
        print("policy suggest: nothing to propose", file=err)
        return 1
    text = render(result.document)
    try:  # what `policy check` would say of the file
        load_policy_text(text, "suggestion")
    except PolicyInvalid as exc:  # the advisor re-validates every step: this is a bug of ours
        raise AssertionError(f"the suggestion is not a valid policy: {exc.errors}") from None
    diff = "".join(difflib.unified_diff(render(policy.to_json()).splitlines(keepends=True),
                                        text.splitlines(keepends=True), label, "suggested"))  # fmt: skip
    for line in result.proposed:
        print(f"proposed: {clean(line)}", file=err)
    if args.out is None:
        out.write(text)
        err.write(diff)
        return 0
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        print(f"policy suggest: {args.out}: cannot write: {exc.strerror}", file=err)
        return ExitCode.SELF_FAILED
    out.write(diff)
    print(f"policy suggest: wrote {args.out}; review it, then: openshell-sandbox policy apply {args.out}", file=err)
    return 0


def suggest_hint(events: Path, policy: Path | None) -> str | None:
    """Dev mode's exit line when the run holds a refusal: the ``policy suggest --events`` command for it."""
    import shlex

    table = DenialTable(refusals=frozenset({EventName.EGRESS_REFUSED}))
    try:
        with open(events, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if '"deny"' in line or EventName.EGRESS_REFUSED in line:  # most lines are neither: skip the parse
                    try:
                        table.observe(Event.from_wire(json.loads(line)))
                    except (ValueError, TypeError, AttributeError):
                        continue
    except OSError:
        return None
    if not table.entries():
        return None
    command = ["openshell-sandbox", "policy", "suggest", "--events", str(events)]
    if policy is not None:
        command += ["--policy", str(policy.absolute())]
    return f"openshell-sandbox: connections were refused; a policy allowing them: {shlex.join(command)}"
