"""The boundary daemon from control's side, over real mTLS: refusals, lifecycle order, resume.

The boundary runs as a real process (as in a pod); the tests play control with the project's own link code,
and play attackers with certificates that differ from the right one in exactly one way. After every refusal
the daemon must still serve the right peer.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from supervisor.link.h2link import Link, LinkStream
from supervisor.link.rpc import call
from supervisor.link.tls_link import Refused, dial_link
from supervisor.protocol.certs import Bundle, make_ca
from supervisor.protocol.claims import CLAIM_FIELDS, Role
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.tls import ALPN_EGRESS, ALPN_OPS, client_context
from tests.certs_fixtures import SAMPLE_CLAIMS, differing, leaf_bundle

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the boundary daemon runs in model R (root) here")


@dataclass
class Boundary:
    port: int
    log: Path
    control: Bundle
    ca: object
    root: Path

    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def wait_event(self, name: str, timeout: float = 10, **match: object) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if event["event"] == name and all(event.get(k) == v for k, v in match.items()):
                    return event
            time.sleep(0.05)
        raise AssertionError(f"no {name} {match} in {[e['event'] for e in self.events()]}")


@pytest.fixture
def boundary(tmp_path: Path) -> Iterator[Boundary]:
    now = datetime.datetime.now(datetime.UTC)
    ca = make_ca(validity=datetime.timedelta(days=1), now=now)
    leaf_bundle(tmp_path / "boundary", ca, Role.BOUNDARY)
    control = leaf_bundle(tmp_path / "control", ca, Role.CONTROL)
    log = tmp_path / "boundary.log"
    port_file = tmp_path / "port"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "--mode=boundary", f"--bootstrap={tmp_path / 'boundary'}",
             "--listen=127.0.0.1:0", f"--port-file={port_file}", "--privilege-model=R", "--agent-stdio=pipe",
             "--exit-linger=1", "--workdir=/tmp", "--", "sleep", "1000"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "boundary did not start listening"
            time.sleep(0.02)
        yield Boundary(int(port_file.read_text()), log, control, ca, tmp_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Control:
    """A test stand-in for control: one ops link and the calls made on it."""

    def __init__(self, b: Boundary, bundle: Bundle | None = None) -> None:
        self.b = b
        self.bundle = bundle or b.control
        self.egress: list[Link] = []

    async def __aenter__(self) -> Link:
        ctx = client_context(self.bundle, (ALPN_OPS,))
        tls, _ = await dial_link("127.0.0.1", self.b.port, ctx, self.bundle, ALPN_OPS)
        self.link = Link(tls, client=True)
        self._cm = trio.open_nursery()
        self.nursery = await self._cm.__aenter__()
        await self.nursery.start(self.link.run)
        return self.link

    async def open_egress(self) -> Link:
        """An egress link as control opens them: we dial, the boundary is the HTTP/2 client."""
        ctx = client_context(self.bundle, (ALPN_EGRESS,))
        tls, _ = await dial_link("127.0.0.1", self.b.port, ctx, self.bundle, ALPN_EGRESS)

        async def refuse_all(stream: LinkStream) -> None:
            await stream.send_headers([(":status", "403"), ("openshell-reason", "test")], end_stream=True)

        link = Link(tls, client=False, handler=refuse_all)
        await self.nursery.start(link.run)
        self.egress.append(link)
        return link

    async def __aexit__(self, *exc: object) -> None:
        for link in (self.link, *self.egress):
            await link.aclose()
        await self._cm.__aexit__(None, None, None)


DESCRIPTOR = {
    "backend_name": "openshell.boundary",
    "version": 2,
    "sandbox": SAMPLE_CLAIMS.sandbox,
    "network_policy": SAMPLE_CLAIMS.network_policy,
    "capture_mode": "netns",
    "agent_uid": 1000,
    "agent_gid": 1000,
}


async def expect_error(kind: ErrorKind, link: Link, path: str, body: dict[str, object] | None = None) -> OpError:
    with pytest.raises(OpError) as info:
        await call(link, path, body)
    assert info.value.kind is kind, info.value
    return info.value


async def test_lifecycle_order_is_enforced_and_second_attach_refused(boundary: Boundary) -> None:
    control = Control(boundary)
    async with control as link:
        # Egress links are refused before attach: nothing can be parked on an unbound boundary.
        early = await control.open_egress()
        with trio.fail_after(10):
            await early.wait_closed()
        boundary.wait_event("link.refused", field="state")
        assert (await call(link, "/v1/status"))["state"] == "idle"
        await expect_error(ErrorKind.INVALID, link, "/v1/confirm")
        await expect_error(ErrorKind.INVALID, link, "/v1/start")
        await expect_error(ErrorKind.INVALID, link, "/v1/wait", {"handle": "p_0123456789abcdef"})
        # (a refused descriptor ends the boundary: tests/integration/test_attach_refusal.py and below)
        assert (await call(link, "/v1/attach", DESCRIPTOR))["state"] == "bound"
        second = await expect_error(ErrorKind.DENIED, link, "/v1/attach", DESCRIPTOR)
        assert "second attach" in second.reason
        await expect_error(ErrorKind.INVALID, link, "/v1/start")  # Bound: confirm first
        await expect_error(ErrorKind.INVALID, link, "/v1/terminate", {"handle": "p_0123456789abcdef"})
        unavailable = await expect_error(ErrorKind.UNAVAILABLE, link, "/v1/confirm")
        assert "egress" in unavailable.reason  # confirm needs mediation connected
        await control.open_egress()
        with trio.fail_after(10):
            while (await call(link, "/v1/status"))["links"] < 2:  # noqa: ASYNC110 - polls the remote side
                await trio.sleep(0.05)
        ready = await call(link, "/v1/confirm")
        assert ready["state"] == "ready" and ready["fence"]["links"][0]["name"] == "lo"
        assert ready["fence"]["probe"] == "captured"
        running = await call(link, "/v1/start")
        assert running["state"] == "running" and running["agent"].startswith("p_")
        await expect_error(ErrorKind.INVALID, link, "/v1/start")
        await expect_error(ErrorKind.DENIED, link, "/v1/attach", DESCRIPTOR)

    # control reconnects: resume, never a second attach; the agent kept running.
    async with Control(boundary) as link:
        resumed = await call(link, "/v1/resume")
        assert resumed["state"] == "running"
        assert resumed["agent"]["handle"] == running["agent"] and resumed["agent"]["result"] is None

        # the agent ends: terminate on it is 410 terminated, carrying its result (§1.3-1.4), never a 200
        await call(link, "/v1/signal", {"handle": running["agent"], "signal": "KILL"})
        result = await call(link, "/v1/wait", {"handle": running["agent"]})
        ended = await expect_error(ErrorKind.TERMINATED, link, "/v1/terminate", {"handle": running["agent"]})
        assert ended.result is not None and ended.result.to_wire() == result and result["signal"] == "KILL", ended


@pytest.mark.parametrize(
    ("change", "kind"),
    [({"version": 3}, ErrorKind.INVALID), ({"surprise": True}, ErrorKind.INVALID),
     ({"sandbox": "someone-else"}, ErrorKind.DENIED), ({"capture_mode": "proxy-env"}, ErrorKind.DENIED)],
)  # fmt: skip
async def test_refused_descriptor_replies_then_ends_the_boundary(
    boundary: Boundary, change: dict[str, object], kind: ErrorKind
) -> None:
    async with Control(boundary) as link:
        await expect_error(kind, link, "/v1/attach", {**DESCRIPTOR, **change})
    event = boundary.wait_event("boundary.exit")
    assert event["code"] == 125
    assert not [e for e in boundary.events() if e["event"] == "lifecycle.bound"], "a refused attach prepared nothing"


@pytest.mark.parametrize("field", CLAIM_FIELDS)
async def test_control_with_one_differing_claim_is_refused(boundary: Boundary, field: str) -> None:
    attacker = leaf_bundle(
        boundary.root / f"attacker-{field}", boundary.ca, Role.CONTROL,  # type: ignore[arg-type]
        cert_claims=differing(SAMPLE_CLAIMS, field), expected=SAMPLE_CLAIMS,
    )  # fmt: skip
    with pytest.raises((Refused, OpError, trio.BrokenResourceError)):
        async with Control(boundary, attacker) as link:
            await call(link, "/v1/status")
    event = boundary.wait_event("link.refused", field=field)
    assert str(event["peer"]).startswith("127.0.0.1:")
    async with Control(boundary) as link:  # the right control is still served
        assert (await call(link, "/v1/status"))["state"] == "idle"


async def test_boundary_certificate_cannot_act_as_control(boundary: Boundary) -> None:
    impostor = leaf_bundle(
        boundary.root / "impostor", boundary.ca, Role.CONTROL,  # type: ignore[arg-type]
        cert_role=Role.BOUNDARY, expected=SAMPLE_CLAIMS,
    )  # fmt: skip
    with pytest.raises((Refused, OpError, trio.BrokenResourceError)):
        async with Control(boundary, impostor) as link:
            await call(link, "/v1/status")
    boundary.wait_event("link.refused", field="role")


async def test_wrong_ca_is_refused(boundary: Boundary) -> None:
    other = make_ca(validity=datetime.timedelta(days=1), now=datetime.datetime.now(datetime.UTC))
    stranger = leaf_bundle(boundary.root / "stranger", other, Role.CONTROL, trust=boundary.ca)  # type: ignore[arg-type]
    with pytest.raises((Refused, OpError, trio.BrokenResourceError)):
        async with Control(boundary, stranger) as link:
            await call(link, "/v1/status")
    boundary.wait_event("link.refused", field="tls")


@pytest.mark.parametrize(
    "payload",
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 64, os.urandom(512), b"SSH-2.0-OpenSSH_9.2\r\n"],
    ids=["plain-http", "zeros", "random", "ssh"],
)
async def test_non_tls_bytes_are_refused_and_logged(boundary: Boundary, payload: bytes) -> None:
    with socket.create_connection(("127.0.0.1", boundary.port), timeout=5) as raw:
        raw.sendall(payload)
        try:
            raw.shutdown(socket.SHUT_WR)  # the boundary may have refused (reset) the connection already
            answer = raw.recv(4096)
        except OSError:  # ENOTCONN or ECONNRESET: refused before or after our half-close
            answer = b""
    assert b"HTTP" not in answer and b"SSH" not in answer
    boundary.wait_event("link.refused", field="tls")
    async with Control(boundary) as link:
        assert (await call(link, "/v1/status"))["state"] == "idle"


async def test_missing_alpn_is_refused(boundary: Boundary) -> None:
    import ssl

    ctx = client_context(boundary.control, (ALPN_OPS,))
    ctx.set_alpn_protocols(["h2"])
    with pytest.raises((Refused, ssl.SSLError, OSError)):
        await dial_link("127.0.0.1", boundary.port, ctx, boundary.control, ALPN_OPS)
    async with Control(boundary) as link:
        assert (await call(link, "/v1/status"))["state"] == "idle"
