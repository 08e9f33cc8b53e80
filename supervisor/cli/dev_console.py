"""What dev mode tells the person at the terminal, derived from the daemons' JSON events.

Both daemons append their events to ``events.jsonl`` (docs/design.md "Events"); dev mode tails that file and
prints, on stderr, a few human lines instead of the JSON:

* one **ready line** when control reports the agent running: the sandbox's name, the policy and its
  generation, the fence and privilege model, the command for a shell, where the log is;
* one **refusal line** per refused connection (and per refused request inside an inspected tunnel): its OCSF
  shorthand (``NET:OPEN [MED] DENIED curl(42) -> blocked.test:443 [reason:…]``: the binary, the destination, the
  reason) and the ``policy decide`` command that explains the decision — against the user's policy file while the
  generation that decided is the file's, else against that generation of the running sandbox (``--api SOCK
  --generation N``: after a ``policy apply``, the file no longer says what decided);
* one line per request whose origin control could not verify (``upstream_tls_failed``): the certificate problem
  and ``--upstream-ca``, the flag that makes control trust a private CA;
* one line per name the DNS stub refused, once per name;
* one line when the boundary refused the sandbox's set-up (it then exits) or lost enforcement (the fence
  changed under a running workload: every workload process was killed);
* when the watched policy file turns invalid: what control does (quarantine, or keeps the last valid policy)
  and every error, as ``policy check`` prints them;
* one line when the agent could not be started (``cannot run PROGRAM: REASON``);
* one line when the kernel killed the agent at the workload's memory limit (its result says ``oom-killed``).

Rules:

1. Everything printed that came from the workload's side — a binary path, a host name, a reason — is
   sanitised first: the agent chooses its executables' names, and a name holding escape sequences must not
   be able to rewrite the operator's terminal (``supervisor.cli.human.clean``).
2. The tail reads complete lines only (a line still being written is left for the next read), from where the
   last read stopped; a line that is not a JSON object is skipped, never fatal.
3. Pure apart from :class:`EventsTail`'s reads: :meth:`Console.lines_for` maps one event to the lines to print.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

from supervisor.cli.human import clean, format_size, policy_error_text
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event
from supervisor.protocol.exit_result import EndReason
from supervisor.protocol.json_value import JsonValue
from supervisor.protocol.ocsf import shorthand
from supervisor.protocol.outcome_reasons import OutcomeReason

PREFIX = "openshell-sandbox: "
UPSTREAM_TLS_FAILED = OutcomeReason.UPSTREAM_TLS_FAILED  # the http event's reason when control did not trust the origin
REFUSED = {"deny", "denied", "refused"}


def _split_destination(destination: str) -> tuple[str, str]:
    host, sep, port = destination.rpartition(":")
    if not sep:
        return destination, ""
    return host.strip("[]"), port


class Console:
    """Turns events into the human lines of dev mode's terminal (see the module's rules)."""

    def __init__(self, *, sandbox: str, policy: Path, policy_label: str, events_path: Path,
                 api: Path | None = None, policy_source: str | None = None) -> None:  # fmt: skip
        self.sandbox = sandbox
        self.policy = policy  # the file `policy decide` is pointed at while it is the source of the policy in force
        self.api = api  # the sandbox's API socket, for `policy decide --generation N` once the file is not the source
        self.policy_source = policy_source  # how control names that file in its policy.generation events
        self._not_the_file: set[int] = set()  # generations whose source is not the file (an apply, a quarantine)
        self.policy_label = policy_label
        self.events_path = events_path
        self.ready_printed = False
        self._policy_generation: JsonValue = None
        self._fence: Mapping[str, JsonValue] = {}
        self._dns_refused: set[str] = set()
        self._memory_limit: JsonValue = None

    def lines_for(self, event: Mapping[str, JsonValue]) -> list[str]:
        kind = event.get("event")
        if kind == EventName.POLICY_GENERATION and (
            event.get("source") != self.policy_source or event.get("status") != "loaded"
        ):  # decided by what the file does not say (an applied policy, quarantine): explained by generation
            self._not_the_file.add(_int(event.get("generation")))
        if kind == EventName.LIFECYCLE_BOUND and event.get("component") == "boundary":
            self._policy_generation = event.get("policy_generation")
        elif kind == EventName.POLICY_APPLIED:
            self._policy_generation = event.get("generation")
        elif kind == EventName.LIFECYCLE_READY and isinstance(fence := event.get("fence"), dict):
            self._fence = fence
        elif kind == EventName.LIFECYCLE_RUNNING and event.get("component") == "control" and not self.ready_printed:
            self.ready_printed = True
            return [self._ready_line()]
        elif kind == EventName.HTTP and event.get("reason") == UPSTREAM_TLS_FAILED:
            return [self._upstream_tls_line(event)]
        elif kind in (EventName.EGRESS, EventName.EGRESS_REFUSED, EventName.HTTP) and (
            kind == EventName.EGRESS_REFUSED or _refused(event)
        ):
            return [self._refusal_line(event)]
        elif kind == EventName.BOUNDARY_REFUSED and event.get("component") == "control":
            error = event.get("error")
            why = error.get("reason") if isinstance(error, Mapping) else None
            return [f"{PREFIX}the boundary refused the sandbox's set-up and exited: {clean(why or 'no reason given')}"]
        elif kind == EventName.ENFORCEMENT_LOST and event.get("component") == "boundary":
            reason = clean(event.get("reason") or "the fence changed")
            return [f"{PREFIX}enforcement lost, every workload process was killed: {reason}"]
        elif kind == EventName.POLICY_GENERATION and event.get("status") in ("quarantined", "retained"):
            return self._policy_failure_lines(event)
        elif kind == EventName.AGENT_LAUNCH_FAILED and event.get("component") == "boundary":
            return [launch_failure_line(event.get("program"), event.get("error"))]
        elif kind == EventName.LIMITS_MEMORY:
            self._memory_limit = event.get("limit")
        elif kind == EventName.AGENT_EXITED and event.get("component") == "boundary":
            result = event.get("result")
            if isinstance(result, Mapping) and result.get("reason") == EndReason.OOM_KILLED:
                return [self._oom_line()]
        elif kind == EventName.DNS and event.get("decision") == "refused":
            name = str(event.get("name", ""))
            if name not in self._dns_refused:
                self._dns_refused.add(name)
                return [f"{PREFIX}refused DNS name {clean(name)}: {clean(event.get('reason', 'refused'))}"]
        return []

    @staticmethod
    def _policy_failure_lines(event: Mapping[str, JsonValue]) -> list[str]:
        """An invalid revision of the policy file: what control does about it, then every error in it."""
        source = clean(event.get("source") or "the policy file")
        if event.get("status") == "quarantined":
            what = f"quarantined (generation {clean(event.get('generation'))}): every new connection is denied"
        else:
            what = "kept the last valid policy (retain-last-valid)"
        errors = event.get("errors")
        errors = errors if isinstance(errors, list) else []
        return [f"{PREFIX}{source} is invalid; {what} until it is fixed:",
                *(f"  {clean(policy_error_text(error))}" for error in errors)]  # fmt: skip

    def _upstream_tls_line(self, event: Mapping[str, JsonValue]) -> str:
        """The policy allowed it, control did not trust the origin: the certificate problem and the flag for it."""
        what = f"{clean(event.get('method') or '')} {clean(event.get('destination') or '?')}".strip()
        who = clean(event["binary"]) if event.get("binary") else "a process"
        problem = clean(event.get("detail") or "the origin's TLS handshake failed")
        return (f"{PREFIX}{who} → {what}: upstream_tls_failed: {problem}; if the origin's CA is one you trust "
                "(a private or corporate CA), give it to control with --upstream-ca FILE")  # fmt: skip

    def _oom_line(self) -> str:
        limit = self._memory_limit
        size = f" ({format_size(limit)})" if isinstance(limit, int) and not isinstance(limit, bool) else ""
        return f"{PREFIX}the agent was killed by the kernel: out of memory at the workload's memory limit{size}" + (
            "; --memory-limit to raise it"
        )

    def _ready_line(self) -> str:
        fence = self._fence
        generation = "?" if self._policy_generation is None else clean(self._policy_generation)
        return (
            f"{PREFIX}sandbox {self.sandbox} is ready · policy {self.policy_label} (generation {generation})"
            f" · fence {clean(fence.get('mode', '?'))}{self._probe_note(fence)}, model"
            f" {clean(fence.get('privilege_model', '?'))}"
            f" · shell: openshell-sandbox exec -it -- sh · log: {self.events_path}"
        )

    @staticmethod
    def _probe_note(fence: Mapping[str, JsonValue]) -> str:
        """Only a fence that was not probed says so (model P in dev mode: acknowledged-unprobed)."""
        probe = fence.get("probe")
        return f" ({clean(probe)})" if probe not in (None, "captured", "canary") else ""

    def _refusal_line(self, event: Mapping[str, JsonValue]) -> str:
        """The OCSF shorthand of the refusal (docs/reference/policy.md §4.1), then the command that explains it."""
        line = f"{PREFIX}{clean(shorthand(Event.from_wire(event)))}"
        explain = self.explain_command(event)
        return f"{line} (why: {explain})" if explain else line

    def explain_command(self, event: Mapping[str, JsonValue]) -> str | None:
        """The ``policy decide`` command that reproduces this decision, or ``None`` when it is no decision."""
        reason = str(event.get("reason") or "")
        if event.get("event") == EventName.EGRESS_REFUSED or reason.startswith(OutcomeReason.IDENTITY_UNRESOLVED):
            return None  # refused before any policy decision: nothing for `policy decide` to explain
        host, port = _split_destination(str(event.get("destination") or ""))
        if not host or not port.isdigit():
            return None
        generation = event.get("policy_generation")
        if isinstance(generation, int) and generation in self._not_the_file and self.api is not None:
            source = ["--api", str(self.api), "--generation", str(generation)]  # the policy that decided it
        else:
            source = ["--policy", str(self.policy)]
        argv = ["openshell-sandbox", "policy", "decide", *source, "--host", host, "--port", port]
        if event.get("binary"):
            argv += ["--binary", str(event["binary"])]
        ancestors = event.get("ancestors")
        if isinstance(ancestors, list):
            for ancestor in ancestors:
                argv += ["--ancestor", str(ancestor)]
        if event.get("event") == EventName.HTTP and event.get("method") and event.get("path"):
            argv += ["--method", str(event["method"]), "--path", str(event["path"])]
        return clean(shlex.join(argv))


def launch_failure_line(program: object, error: object) -> str:
    """``cannot run PROGRAM: REASON`` — what the agent's (or an exec's) launch failure says to a person: the
    program as it was asked for and, for a failed ``execve``, the system's words for its errno."""
    error = error if isinstance(error, Mapping) else {}
    errno = error.get("errno")
    if isinstance(errno, int) and not isinstance(errno, bool) and errno > 0:
        why = os.strerror(errno)
        if error.get("stage") not in (None, "execve"):
            why = f"{why} (at {clean(error.get('stage'))})"
    else:
        why = clean(error.get("reason") or "the launch failed")
    return f"{PREFIX}cannot run {clean(program) if program else 'the agent'}: {why}"


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _refused(event: Mapping[str, JsonValue]) -> bool:
    return str(event.get("decision", "")) in REFUSED


class EventsTail:
    """New complete JSON-object lines of a file, from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, JsonValue]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        return list(_objects(complete))


def _objects(lines: Iterable[bytes]) -> Iterable[dict[str, JsonValue]]:
    for raw in lines:
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value
