"""Every link operation's request and reply writes exactly the JSON object the link has always carried (a peer may
be an older build during a rolling update), and reads it back to the same value."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from supervisor.protocol.acks import ExitAck, NoArguments, PolicyAck, PolicyAcknowledged
from supervisor.protocol.attach import AttachReader, AttachReply, AttachRequest, CaptureMode, check_claims
from supervisor.protocol.channel_ops import AttachStreamRequest, ExecAccepted, ForwardAccepted, ForwardRequest
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.exit_result import EndReason, ExitResult
from supervisor.protocol.fence_canary import CanaryReport, FenceObserved, FenceObservedReply, ProbeResult
from supervisor.protocol.fence_report import (
    CAPTURED,
    PROBED_BY_CANARY,
    UNPROBED,
    ConfirmReply,
    ConfirmRequest,
    FenceReport,
)
from supervisor.protocol.lifecycle import StartReply, State
from supervisor.protocol.process_ops import (
    ExecRequest,
    ForwardTarget,
    SignalReply,
    SignalRequest,
    SignalScope,
    TerminateRequest,
    WaitRequest,
)
from supervisor.protocol.status import AgentStatus, ResumeRequest, StatusReply
from tests.certs_fixtures import SAMPLE_CLAIMS

HANDLE = "p_0123456789abcdef"

CASES: list[tuple[Any, dict[str, Any]]] = [
    (WaitRequest(HANDLE), {"handle": HANDLE}),
    (WaitRequest(HANDLE, 2.5), {"handle": HANDLE, "timeout_s": 2.5}),
    (SignalRequest(HANDLE, "TERM", SignalScope.GROUP), {"handle": HANDLE, "signal": "TERM", "scope": "group"}),
    (SignalReply(HANDLE, "TERM"), {"handle": HANDLE, "signal": "TERM", "delivered": True}),
    (TerminateRequest(HANDLE, 3.0), {"handle": HANDLE, "grace_s": 3.0}),
    (PolicyAck(7), {"policy_generation": 7}),
    (PolicyAcknowledged(7), {"policy_generation": 7}),
    (ExitAck(), {"acknowledged": True}),
    (NoArguments(), {}),
    (StartReply(State.RUNNING, HANDLE), {"state": "running", "agent": HANDLE}),
    (
        ProbeResult(3, "192.0.2.7:9", False, "ECONNREFUSED: Connection refused"),
        {
            "probe": 3,
            "target": "192.0.2.7:9",
            "connected": False,
            "error": "ECONNREFUSED: Connection refused",
            "conclusive": True,
        },
    ),
    (
        FenceObserved(CanaryReport(3, 0, "ok", ("10.0.0.1:5",))),
        {"canary": {"probe": 3, "seen": 0, "self_check": "ok", "peers": ["10.0.0.1:5"]}},
    ),
    (FenceObservedReply(3, True), {"probe": 3, "observed": True}),
    (
        ExecRequest(("ls", "-l"), (("A", "1"),), "/work", True, 100, 40, "null", 5.0, 1.0),
        {
            "argv": ["ls", "-l"],
            "env": {"A": "1"},
            "cwd": "/work",
            "tty": True,
            "cols": 100,
            "rows": 40,
            "stdin": "null",
            "timeout_s": 5.0,
            "grace_s": 1.0,
        },
    ),
    (
        ExecRequest(("true",)),
        {
            "argv": ["true"],
            "env": {},
            "tty": False,
            "cols": 80,
            "rows": 24,
            "stdin": "pipe",
            "timeout_s": 0.0,
            "grace_s": 5.0,
        },
    ),
    (ExecAccepted(HANDLE, False), {"handle": HANDLE, "tty": False}),
    (AttachStreamRequest(HANDLE), {"handle": HANDLE}),
    (ForwardRequest(ForwardTarget("127.0.0.1", 8080, socket.AF_INET)), {"host": "127.0.0.1", "port": 8080}),
    (
        ForwardRequest(ForwardTarget("::1", 22, socket.AF_INET6), probe=True),
        {"host": "::1", "port": 22, "probe": True},
    ),
    (ForwardAccepted("127.0.0.1", 8080), {"host": "127.0.0.1", "port": 8080}),
    (ForwardAccepted("127.0.0.1", 8080, probe=True), {"host": "127.0.0.1", "port": 8080, "probe": True}),
    (
        AttachRequest(
            "sb",
            "np",
            CaptureMode.PROXY_ENV,
            1001,
            1002,
            4,
            interception_ca_pem="PEM",
            credential_placeholders={"K": "v"},
            acknowledge_external_fence=True,
            fence_canary="198.51.100.1:7444",
            capture_ports=(80, 8080),
        ),
        {
            "sandbox": "sb",
            "network_policy": "np",
            "capture_mode": "proxy-env",
            "agent_uid": 1001,
            "agent_gid": 1002,
            "policy_generation": 4,
            "static_policy": {},
            "interception_ca_pem": "PEM",
            "credential_placeholders": {"K": "v"},
            "acknowledge_external_fence": True,
            "fence_canary": "198.51.100.1:7444",
            "acknowledge_unprobed_fence": False,
            "capture_ports": [80, 8080],
            "backend_name": "openshell.boundary",
            "version": 2,
        },
    ),
    (
        AttachReply(State.BOUND, "b-1", "R", {"mode": "anyip", "netns": True, "listeners": {"tcp4:80": "fd 5"}}),
        {
            "state": "bound",
            "boundary_instance": "b-1",
            "privilege_model": "R",
            "capture": {"mode": "anyip", "netns": True, "listeners": {"tcp4:80": "fd 5"}},
        },
    ),
    (ConfirmRequest(), {}),
    (
        ConfirmRequest(CanaryReport(2, 0, "ok")),
        {"canary": {"probe": 2, "seen": 0, "self_check": "ok", "peers": []}},
    ),
    (
        ConfirmReply(State.READY, FenceReport(CaptureMode.NETNS, "R", CAPTURED, "f1", [{"name": "lo"}])),
        {
            "state": "ready",
            "fence": {
                "mode": "netns",
                "privilege_model": "R",
                "fingerprint": "f1",
                "links": [{"name": "lo"}],
                "probe": "captured",
            },
        },
    ),
    (
        FenceReport(
            CaptureMode.PROXY_ENV,
            "P",
            PROBED_BY_CANARY,
            canary="192.0.2.9:7",
            probe_error="ETIMEDOUT: x",
            canary_self_check="ok",
        ),
        {
            "mode": "proxy-env",
            "privilege_model": "P",
            "fingerprint": None,
            "probe": "canary",
            "canary": "192.0.2.9:7",
            "probe_error": "ETIMEDOUT: x",
            "canary_self_check": "ok",
        },
    ),
    (
        FenceReport(CaptureMode.PROXY_ENV, "P", UNPROBED),
        {"mode": "proxy-env", "privilege_model": "P", "fingerprint": None, "probe": "acknowledged-unprobed"},
    ),
    (ResumeRequest("ab12"), {"interception_ca_sha256": "ab12"}),
    (
        StatusReply(
            State.RUNNING,
            "b-1",
            "R",
            "netns",
            FenceReport(CaptureMode.NETNS, "R", CAPTURED, "f1", []),
            None,
            3,
            AgentStatus(HANDLE, ExitResult(HANDLE, 0, None, None, 0, False, EndReason.EXITED, "2026-01-01T00:00:00Z")),
            ({"handle": HANDLE, "kind": "agent", "argv": ["sh"]},),
            2,
            {"pids": {"max": 512}},
            "ab12",
        ),
        {
            "state": "running",
            "boundary_instance": "b-1",
            "privilege_model": "R",
            "capture_mode": "netns",
            "fence": {"mode": "netns", "privilege_model": "R", "fingerprint": "f1", "links": [], "probe": "captured"},
            "enforcement_lost": None,
            "policy_generation": 3,
            "agent": {
                "handle": HANDLE,
                "result": {
                    "handle": HANDLE,
                    "exited": True,
                    "code": 0,
                    "signal": None,
                    "signal_number": None,
                    "rendered": 0,
                    "core_dumped": False,
                    "reason": "exited",
                    "ended_at": "2026-01-01T00:00:00Z",
                },
            },
            "processes": [{"handle": HANDLE, "kind": "agent", "argv": ["sh"]}],
            "links": 2,
            "limits": {"pids": {"max": 512}},
            "interception_ca_sha256": "ab12",
        },
    ),
    (
        StatusReply(State.IDLE, "b-1", "P", links=0),
        {
            "state": "idle",
            "boundary_instance": "b-1",
            "privilege_model": "P",
            "capture_mode": None,
            "fence": None,
            "enforcement_lost": None,
            "policy_generation": None,
            "agent": None,
            "processes": [],
            "links": 0,
            "limits": None,
            "interception_ca_sha256": None,
        },
    ),
]


@pytest.mark.parametrize(("message", "wire"), CASES, ids=lambda value: type(value).__name__)
def test_round_trip_is_the_exact_object(message: Any, wire: dict[str, Any]) -> None:
    assert message.to_wire() == wire
    assert list(message.to_wire()) == list(wire)  # the keys in the order they are written on the wire
    assert type(message).from_wire(wire) == message


def test_no_arguments_ignores_what_a_newer_peer_adds() -> None:
    assert NoArguments.from_wire({"something": 1}) == NoArguments()


def test_policy_ack_names_the_field() -> None:
    with pytest.raises(OpError) as caught:
        PolicyAck.from_wire({"policy_generation": True})
    assert caught.value.kind is ErrorKind.INVALID
    assert caught.value.field == "policy_generation"
    assert caught.value.reason == "policy_generation must be a non-negative integer"


def test_replies_control_never_read_are_lenient_on_missing_fields() -> None:
    assert PolicyAcknowledged.from_wire({}) == PolicyAcknowledged(None)
    assert ExitAck.from_wire({}) == ExitAck()
    with pytest.raises(OpError) as caught:
        ExitAck.from_wire({"acknowledged": "yes"})
    assert caught.value.field == "acknowledged"


def test_signal_reply_names_the_field() -> None:
    with pytest.raises(OpError) as caught:
        SignalReply.from_wire({"handle": 1, "signal": "TERM"})
    assert (caught.value.kind, caught.value.field) == (ErrorKind.INVALID, "handle")


def test_start_reply_refuses_an_unknown_state() -> None:
    with pytest.raises(OpError) as caught:
        StartReply.from_wire({"state": "flying", "agent": HANDLE})
    assert caught.value.field == "state"
    assert caught.value.reason == "the boundary reported state 'flying'"


def test_fence_observed_names_the_canary_field() -> None:
    with pytest.raises(OpError) as caught:
        FenceObserved.from_wire({"canary": {"probe": 1, "seen": -1, "self_check": "ok"}})
    assert caught.value.field == "canary.seen"


def test_attach_stream_keeps_its_refusal() -> None:
    with pytest.raises(OpError) as caught:
        AttachStreamRequest.from_wire({"handle": HANDLE, "extra": 1})
    assert (caught.value.reason, caught.value.field) == ("body must be {handle}", "handle")


def test_a_forward_request_reads_a_target_as_the_boundary_dials_it() -> None:
    request = ForwardRequest.from_wire({"host": "[::ffff:127.0.0.1]", "port": 80})
    assert request.to_wire() == {"host": "127.0.0.1", "port": 80}
    with pytest.raises(OpError) as caught:
        ForwardRequest.from_wire({"host": "10.0.0.1", "port": 80})
    assert (caught.value.kind, caught.value.field) == (ErrorKind.DENIED, "host")


def test_an_attach_descriptor_naming_another_sandbox_is_denied() -> None:
    request = AttachRequest.from_wire(AttachRequest("other", SAMPLE_CLAIMS.network_policy).to_wire())
    with pytest.raises(OpError) as caught:
        check_claims(request, SAMPLE_CLAIMS)
    assert (caught.value.kind, caught.value.field) == (ErrorKind.DENIED, "sandbox")


def test_an_attach_reply_from_a_peer_that_says_less_stays_as_it_was() -> None:
    assert AttachReply.from_wire({"state": "bound"}).to_wire() == {"state": "bound"}


def test_a_canary_report_confirm_cannot_read_is_kept_as_its_problem() -> None:
    request = ConfirmRequest.from_wire({"canary": {"probe": 1}})
    assert request.canary is None
    assert request.canary_problem == "seen is missing or has the wrong type"
    assert ConfirmRequest.from_wire({"canary": None}) == ConfirmRequest()


def test_resume_request_never_refuses_what_the_boundary_never_read() -> None:
    assert ResumeRequest.from_wire({"interception_ca_sha256": 5, "x": 1}) == ResumeRequest(None)


def test_status_reply_names_a_field_of_the_wrong_type() -> None:
    with pytest.raises(OpError) as caught:
        StatusReply.from_wire({"state": "ready", "links": "two"})
    assert (caught.value.kind, caught.value.field) == (ErrorKind.INVALID, "links")
    with pytest.raises(OpError) as caught:
        StatusReply.from_wire({"state": "ready", "agent": {"handle": HANDLE, "result": {"code": "x"}}})
    assert caught.value.field == "agent"


def test_the_boundary_reads_a_descriptor_against_its_claims_before_its_static_policy() -> None:
    wire = {**AttachRequest("other", SAMPLE_CLAIMS.network_policy).to_wire(), "static_policy": {"landlock": 5}}
    with pytest.raises(OpError) as caught:
        AttachReader(SAMPLE_CLAIMS).from_wire(wire)
    assert (caught.value.kind, caught.value.field) == (ErrorKind.DENIED, "sandbox")
