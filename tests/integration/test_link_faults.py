"""Control survives its link: a real control process against a boundary that fails on purpose.

The boundary here is a stand-in served by this test with the project's own link code (``accept_link`` with its
claim check and GOAWAY refusal, ``Link``, ``Router``), so that each fault happens exactly where the test says:

* the link is hung up (TCP closed under TLS, no goodbye) at each lifecycle step — attach, confirm, start,
  resume — and after it, while control waits on the agent;
* control's certificate is refused for each fault: a differing claim and the wrong role (both after a completed
  TLS 1.3 handshake: the refusal arrives as a GOAWAY naming the field), another CA, an expired leaf and a
  not-yet-valid leaf (``certs issue --not-before control=+Ns``; TLS alerts).

Each time control must keep running, log every failure exactly once (``link.failed``: peer, step, reason) with
one backoff step between attempts (doubling from 50 ms; only a successful attach or resume resets it), and
come up — attach/resume, the agent followed — once the fault is gone. Control loads its key pair at every
dial, which is how the expired leaf is replaced under a running control.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.link.h2link import Link
from supervisor.link.rpc import Router
from supervisor.link.socket_tls import SocketTLSStream
from supervisor.link.tls_link import Refused, accept_link
from supervisor.protocol.certs import Bundle, CertificateAuthority, make_ca, make_leaf, write_role_dir
from supervisor.protocol.claims import Role
from supervisor.protocol.tls import ALPN_EGRESS, server_context
from tests.certs_fixtures import SAMPLE_CLAIMS, differing, leaf_bundle

CLI = [sys.executable, "-m", "supervisor.cli"]
FAULTS = 2  # how many times each fault fires before the stand-in behaves
AGENT = "p_0123456789abcdef"
BACKOFF_START = 0.05


@dataclass
class StandIn:
    """A boundary that answers the lifecycle like the real one and fails where it is told to."""

    bundle: Bundle
    state: str = "idle"
    faults: dict[str, int] = field(default_factory=dict)
    waiting: bool = False
    agent_exits: bool = False  # wait returns at once: the agent has exited
    exit_acked: bool = False
    ops: Link | None = None
    refused: list[Refused] = field(default_factory=list)

    def router(self) -> Router:
        router = Router()
        for path in ("status", "attach", "confirm", "start", "resume", "wait", "policy-ack", "agent/exit-ack"):
            router.unary_raw(f"/v1/{path}", self._op(path))
        return router

    def _op(self, name: str) -> Any:
        async def handler(body: dict[str, Any]) -> dict[str, Any]:
            step = "after" if name == "wait" else name
            if self.faults.get(step, 0) > 0:
                self.faults[step] -= 1
                await self.hang_up()
                return {}
            if name == "attach":
                self.state = "bound"
            elif name == "confirm":
                self.state = "ready"
                return {"state": self.state, "fence": {"mode": "netns", "probe": "captured"}}
            elif name == "start":
                self.state = "running"
                return {"state": self.state, "agent": AGENT}
            elif name == "wait":
                self.waiting = True
                if self.agent_exits:
                    self.state = "ended"
                    return {"handle": AGENT, "code": 0, "rendered": 0, "reason": "exited"}
                await trio.sleep_forever()
            elif name == "agent/exit-ack":
                self.exit_acked = True
                return {"acknowledged": True}
            return self.status()

        return handler

    def status(self) -> dict[str, Any]:
        agent = {"handle": AGENT, "result": None} if self.state in ("running", "ended") else None
        return {"state": self.state, "agent": agent, "fence": {"mode": "netns"} if self.state != "idle" else None}

    async def hang_up(self) -> None:
        """Close the TCP connection under the TLS session: no close_notify, no GOAWAY."""
        assert self.ops is not None
        tls = self.ops.transport
        assert isinstance(tls, SocketTLSStream)
        await tls.close_transport()

    async def connection(self, stream: trio.SocketStream) -> None:
        ctx = server_context(self.bundle)
        try:
            tls, _claims, alpn = await accept_link(stream, ctx, self.bundle)
        except Refused as exc:
            self.refused.append(exc)
            return
        if alpn == ALPN_EGRESS:
            await Link(tls, client=True).run()
            return
        link = Link(tls, client=False, handler=self.router().handle)
        self.ops = link
        await link.run()


@dataclass
class Control:
    proc: subprocess.Popen[bytes]
    log: Path
    bootstrap: Path

    def events(self, name: str = "link.failed") -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                if event["event"] == name:
                    out.append(event)
        return out

    def ops_failures(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["alpn"] == "openshell-ops/1"]

    def alive(self) -> None:
        assert self.proc.poll() is None, f"control exited ({self.proc.returncode}):\n{self.log.read_text()[-4000:]}"

    async def wait_for(self, what: str, check: Any, deadline_s: float = 30) -> Any:
        with trio.move_on_after(deadline_s):
            while True:
                self.alive()
                result = check()
                if result:
                    return result
                await trio.sleep(0.05)
        raise AssertionError(f"control never reached {what}; its log:\n{self.log.read_text()[-4000:]}")


@contextmanager
def run_control(tmp: Path, bootstrap: Path, port: int) -> Iterator[Control]:
    log = tmp / "control.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*CLI, "--mode=control", f"--bootstrap={bootstrap}", f"--boundary=127.0.0.1:{port}",
             f"--api={tmp / 'api.sock'}"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield Control(proc, log, bootstrap)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@asynccontextmanager
async def serve(stand_in: StandIn) -> AsyncIterator[int]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = int(listeners[0].socket.getsockname()[1])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, stand_in.connection, listeners)
        yield port
        nursery.cancel_scope.cancel()


def _bundles(tmp: Path, ca: CertificateAuthority) -> tuple[Bundle, Bundle]:
    return leaf_bundle(tmp / "control", ca, Role.CONTROL), leaf_bundle(tmp / "boundary", ca, Role.BOUNDARY)


def _times(events: list[dict[str, Any]]) -> list[float]:
    return [datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp() for e in events]


def assert_backoff(failures: list[dict[str, Any]], *, resets: bool = False) -> None:
    """One event per attempt, each naming the peer and a reason, spaced by the backoff it announced."""
    assert failures, "no link.failed event"
    for event in failures:
        assert event["peer"].startswith("127.0.0.1:") and event["reason"], event
    delays = [e["retry_in_s"] for e in failures]
    if resets:  # attach/resume succeeded before each failure: every retry starts again from the first step
        assert delays == [BACKOFF_START] * len(delays), delays
    else:
        assert delays == [BACKOFF_START * 2**i for i in range(len(delays))], delays
    times = _times(failures)
    for (before, after), delay in zip(itertools.pairwise(times), delays, strict=False):
        assert after - before >= delay - 0.01, (times, delays)


# -- the link closed at every step --------------------------------------------------------------------------

STEPS = [
    # fault, the state the stand-in starts in, the step control logs, whether a resume/attach preceded it
    ("attach", "idle", "attach", False),
    ("confirm", "idle", "confirm", True),
    ("start", "idle", "start", True),
    ("resume", "running", "resume", False),
    ("after", "idle", "running", True),
]


@pytest.mark.parametrize(("fault", "initial", "step", "resets"), STEPS, ids=[s[0] for s in STEPS])
async def test_link_closed_at_each_step(tmp_path: Path, fault: str, initial: str, step: str, resets: bool) -> None:
    ca = make_ca(validity=datetime.timedelta(days=1))
    _control, boundary = _bundles(tmp_path, ca)
    stand_in = StandIn(boundary, state=initial, faults={fault: FAULTS})
    async with serve(stand_in) as port:
        with run_control(tmp_path, tmp_path / "control", port) as control:
            await control.wait_for("the agent followed", lambda: stand_in.waiting and stand_in.faults[fault] == 0)
            await control.wait_for(f"{FAULTS} failures logged", lambda: len(control.ops_failures()) >= FAULTS)
            failures = control.ops_failures()
            assert [e["step"] for e in failures] == [step] * FAULTS, failures
            assert all("closed" in e["reason"] or "receive failed" in e["reason"] for e in failures), failures
            assert_backoff(failures, resets=resets)
            assert stand_in.state == "running"
            if initial == "running":
                assert control.events("lifecycle.resumed"), "control must resume a running boundary"
            assert not control.events("lifecycle.bound") or initial == "idle"
            await trio.sleep(0.3)  # nothing more is logged once it is up: no duplicate for the same failure
            assert len(control.ops_failures()) == FAULTS
            control.alive()


# -- control's certificate refused, for each fault ------------------------------------------------------------


def _replace_key_pair(directory: Path, ca: CertificateAuthority, **leaf: Any) -> None:
    """Swap control's key pair in place (control reads it at every dial)."""
    staging = directory.parent / f"{directory.name}-next"
    key, cert = make_leaf(ca, SAMPLE_CLAIMS, Role.CONTROL, **leaf)
    write_role_dir(staging, ca.certificate, key, cert, SAMPLE_CLAIMS)
    for name in ("key.pem", "cert.pem"):
        os.replace(staging / name, directory / name)
    shutil.rmtree(staging)


async def _refused_then_up(
    tmp_path: Path, stand_in: StandIn, control_dir: Path, expect: str, field: str | None, fix: Any
) -> None:
    async with serve(stand_in) as port:
        with run_control(tmp_path, control_dir, port) as control:
            failures = await control.wait_for("three refusals", lambda: (f := control.ops_failures())[2:] and f)
            for event in failures:
                assert expect in event["reason"].lower(), event
                assert event.get("field") == field, event
                assert event["step"] in ("status", "handshake"), event  # never past the first call
            print(f"\n{expect}: {len(failures)} refusals, e.g. {failures[0]}")
            fix()
            await control.wait_for("the agent followed", lambda: stand_in.waiting)
            failures = control.ops_failures()
            assert_backoff(failures)
            assert control.events("lifecycle.running")
            control.alive()


@pytest.mark.parametrize("fault", ["claim", "role"])
async def test_refused_after_the_handshake_is_told_the_field(tmp_path: Path, fault: str) -> None:
    ca = make_ca(validity=datetime.timedelta(days=1))
    control, boundary = _bundles(tmp_path, ca)
    if fault == "claim":  # the boundary belongs to another generation of the sandbox: its claims differ
        other = differing(SAMPLE_CLAIMS, "generation")
        refusing = leaf_bundle(tmp_path / "refusing", ca, Role.BOUNDARY, expected=other)
        field_name = "generation"
    else:  # a boundary that takes control's certificate for a boundary's: control's role is the wrong one
        refusing = dataclasses.replace(boundary, role=Role.CONTROL)
        field_name = "role"
    stand_in = StandIn(refusing)

    def fix() -> None:
        stand_in.bundle = boundary

    await _refused_then_up(tmp_path, stand_in, control.directory, f"refused field={field_name}", field_name, fix)
    assert {r.field for r in stand_in.refused} == {field_name}


async def test_wrong_ca_is_refused_in_the_handshake(tmp_path: Path) -> None:
    ca = make_ca(validity=datetime.timedelta(days=1))
    control, boundary = _bundles(tmp_path, ca)
    stranger = make_ca(validity=datetime.timedelta(days=1))
    trusting_another = leaf_bundle(tmp_path / "stranger", ca, Role.BOUNDARY, trust=stranger)
    stand_in = StandIn(trusting_another)

    def fix() -> None:
        stand_in.bundle = boundary

    await _refused_then_up(tmp_path, stand_in, control.directory, "unknown ca", None, fix)
    assert stand_in.refused and {r.field for r in stand_in.refused} == {"tls"}


async def test_expired_leaf_is_refused_until_replaced(tmp_path: Path) -> None:
    ca = make_ca(validity=datetime.timedelta(days=1))
    now = datetime.datetime.now(datetime.UTC)
    key, cert = make_leaf(ca, SAMPLE_CLAIMS, Role.CONTROL, not_before=now - datetime.timedelta(hours=2),
                          not_after=now - datetime.timedelta(hours=1))  # fmt: skip
    write_role_dir(tmp_path / "control", ca.certificate, key, cert, SAMPLE_CLAIMS)
    boundary = leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
    stand_in = StandIn(boundary)
    await _refused_then_up(
        tmp_path, stand_in, tmp_path / "control", "certificate expired", None,
        lambda: _replace_key_pair(tmp_path / "control", ca),
    )  # fmt: skip
    assert stand_in.refused and {r.field for r in stand_in.refused} == {"tls"}


async def test_not_yet_valid_leaf_comes_up_once_valid(tmp_path: Path) -> None:
    """Minted by the CLI with ``--not-before control=+10s``: refused, then accepted with nothing changed. The
    margin must cover issuing the bundle and starting control on a loaded machine (a first dial after it finds
    the leaf already valid and proves nothing); control's backoff (0.05 s doubling) then redials by ~13 s."""
    claims = SAMPLE_CLAIMS
    out = tmp_path / "bundle"
    await trio.run_process(
        [*CLI, "certs", "issue", f"--out={out}", f"--namespace={claims.namespace}", f"--sandbox={claims.sandbox}",
         f"--sandbox-uid={claims.sandbox_uid}", f"--control-deployment={claims.control_deployment}",
         f"--network-policy={claims.network_policy}", f"--image={claims.image}", f"--generation={claims.generation}",
         f"--policy-resource={claims.policy_resource}", "--not-before=control=+10s"],
        check=True, capture_stdout=True, capture_stderr=True,
    )  # fmt: skip
    from supervisor.protocol.certs import load_bundle

    stand_in = StandIn(load_bundle(out / "boundary", Role.BOUNDARY))
    async with serve(stand_in) as port:
        with run_control(tmp_path, out / "control", port) as control:
            await control.wait_for("the agent followed", lambda: stand_in.waiting, deadline_s=90)
            failures = control.ops_failures()
            assert failures, "a not-yet-valid leaf must be refused first"
            # the refusals were the certificate's (the stand-in refused only in the TLS handshake, below); under
            # load one more link may fail for another reason (a connect timeout) before the leaf is valid
            assert any("certificate" in e["reason"].lower() for e in failures), failures
            assert_backoff(failures)
            assert stand_in.refused and {r.field for r in stand_in.refused} == {"tls"}  # in the handshake
            control.alive()


async def test_workload_gone_control_stays_up_not_ready(tmp_path: Path) -> None:
    """The agent exits, the boundary goes away with it: control stays up, not ready, redialling with backoff, and
    answers for the ended sandbox from the agent's result (docs/reference/boundary.md §1.4)."""
    ca = make_ca(validity=datetime.timedelta(days=1))
    _control, boundary = _bundles(tmp_path, ca)
    stand_in = StandIn(boundary, agent_exits=True)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = int(listeners[0].socket.getsockname()[1])
    with run_control(tmp_path, tmp_path / "control", port) as control:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, stand_in.connection, listeners)
            await control.wait_for("the exit acknowledged", lambda: stand_in.exit_acked)
            assert control.events("agent.exited")
            nursery.cancel_scope.cancel()  # the boundary exits: every link closes, nothing listens any more
        for listener in listeners:
            await listener.aclose()
        failures = await control.wait_for("five failed redials", lambda: (f := control.ops_failures())[5:] and f)
        # the agent's end closed every link: one link.closed line for all of them, never a link.failed
        [closed] = control.events("link.closed")
        assert closed["reason"] == "the agent has terminated: reason exited (code 0); the boundary closed its links"
        assert all(e["step"] == "connect" and "connect failed" in e["reason"] for e in failures), failures
        assert not [e for e in control.events() if e["step"] in ("agent-exited", "serving")], control.events()
        assert_backoff(failures)  # the attach reset it once; since then every failure doubles the wait
        ready = await trio.run_process([*CLI, "readyz", f"--api={tmp_path / 'api.sock'}"], check=False,
                                       capture_stdout=True, capture_stderr=True)  # fmt: skip
        assert ready.returncode == 1, ready
        assert b"not attached" in ready.stdout + ready.stderr, ready

        async def cli(command: str, *args: str) -> subprocess.CompletedProcess[bytes]:
            return await trio.run_process([*CLI, command, f"--api={tmp_path / 'api.sock'}", *args], check=False,
                                          capture_stdout=True, capture_stderr=True)  # fmt: skip

        waited = await cli("wait")  # the agent's handle from status, its result from control's memory
        assert waited.returncode == 0, waited
        assert json.loads(waited.stdout)["handle"] == AGENT and json.loads(waited.stdout)["reason"] == "exited"
        started = await cli("exec", "--", "echo", "ran")
        assert started.returncode == 125 and b"ran" not in started.stdout, started
        assert b"terminated: exec: the agent has terminated: reason exited (code 0)" in started.stderr, started
        signalled = await cli("signal", "TERM")
        assert signalled.returncode == 125 and b"terminated: signal: the agent has terminated" in signalled.stderr
        ended = await cli("terminate")  # nothing left to end: 410 terminated, with what ended it
        assert ended.returncode == 125, ended
        assert ended.stderr == b"openshell-sandbox: terminated: terminate: the agent has terminated: reason exited " \
            b"(code 0) already (handle)\n", ended  # fmt: skip
        assert json.loads(ended.stdout)["handle"] == AGENT and json.loads(ended.stdout)["reason"] == "exited"
        control.alive()
