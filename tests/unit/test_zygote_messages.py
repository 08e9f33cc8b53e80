"""The launcher's messages (supervisor/boundary/forkimage/messages.py): each round-trips through its JSON object,
writes the object the launcher always wrote, and refuses a malformed one naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from supervisor.boundary.forkimage import wire
from supervisor.boundary.forkimage.messages import (
    CaptureCall,
    CaptureReply,
    Done,
    ErrorReply,
    Exit,
    KillAll,
    MessageError,
    NamespacePlan,
    Ping,
    PingReply,
    Prepare,
    PrepareReply,
    Ready,
    SocketRequest,
    SpareBack,
    SpareLease,
    SpawnReply,
    SpawnRequest,
    Unowned,
    request_from_wire,
)
from supervisor.protocol.privilege_model import PrivilegeModel

_SPEC: dict[str, Any] = {"argv": ["/bin/true"], "env": {}, "cwd": "/", "uid": 1000, "gid": 1000}
_CONFINEMENT: dict[str, Any] = {"notify": False, "landlock": None}

MESSAGES = [
    Ping(id=1),
    Prepare(id=2, plan=NamespacePlan(PrivilegeModel.R, capture={"mode": "netns"}, root=None)),
    CaptureCall(id=3, fn="probe", args={"port": 443}),
    SocketRequest(id=4, family=2, type=1),
    KillAll(id=5),
    CaptureReply(id=3, result={"found": True}),
    SpawnRequest(_SPEC, (0, 1, 2, 3), id=7, sid=8, notify=None, own_pidns=True),
    SpawnRequest(_SPEC, (0, 1, 2, 3), id=9, sid=10, notify=4),
    SpawnRequest(_SPEC, (0,)),  # a spare's command
    Exit(sid=3, status=9),
    Unowned(count=12, pids=(40, 41)),
    SpareLease(host_pid=1234, ns_pid=1, confinement=_CONFINEMENT, notes=("landlock: abi 3",)),
    SpareBack(notes=("a note",)),
    NamespacePlan(PrivilegeModel.U, agent_ids=(1000, 1000), hide_paths=("/srv",)),
    ErrorReply(id=4, errno=2, error="No such file or directory", stage="exec"),
    ErrorReply(id=5, errno=0, error="launcher not prepared"),
    SpawnReply(id=6, pid=4242, ns_pid=3, nested=True, pty=False),
    PrepareReply(id=1, fd_names=("tcp", "dns"), report={"netns": "ok"}, init_pid=99),
    PrepareReply(id=1),
    PingReply(id=2, pid=77),
    Done(id=3),
    Ready(True, notes=("landlock: abi 3",)),
    Ready(False, errno=1, stage="landlock", detail="Operation not permitted"),
    Ready(False, errno=2, error="mount /proc: No such file or directory"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_each_message_round_trips_through_the_wire(message: Any) -> None:
    data, _ = wire.decode(wire.encode(message.to_wire()), [], 0)
    assert type(message).from_wire(data) == message


def test_the_wire_objects_are_the_ones_the_launcher_always_wrote() -> None:
    assert Exit(3, 9).to_wire() == {"exit": 3, "status": 9}
    assert Unowned(2, (5, 6)).to_wire() == {"unowned": 2, "pids": [5, 6]}
    assert SpareBack(("n",)).to_wire() == {"spare": True, "notes": ["n"]}
    assert SpareLease(1, 2, _CONFINEMENT, ()).to_wire() == {
        "spare": 1, "ns_pid": 2, "confinement": _CONFINEMENT, "notes": [],
    }  # fmt: skip
    assert SpawnRequest(_SPEC, (0,)).to_wire() == {"spec": _SPEC, "stdio": [0]}
    assert ErrorReply(1, 22, "bad", "fork").to_wire() == {
        "id": 1,
        "ok": False,
        "errno": 22,
        "error": "bad",
        "stage": "fork",
    }
    assert ErrorReply(1, 0, "bad").to_wire() == {"id": 1, "ok": False, "errno": 0, "error": "bad"}
    assert SpawnReply(1, 2, 3).to_wire() == {"id": 1, "ok": True, "pid": 2, "ns_pid": 3, "nested": False, "pty": False}
    assert Done(8).to_wire() == {"id": 8, "ok": True}
    assert Ready(False, errno=5, error="x").to_wire() == {"ready": False, "errno": 5, "error": "x"}
    assert list(SpawnRequest(_SPEC, (0, 1, 2, 3), 1, 2).to_wire()) == [
        "op", "id", "sid", "spec", "stdio", "notify", "own_pidns",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "data", "field"),
    [
        (Exit, {"exit": "3", "status": 9}, "'exit' must be int"),
        (Exit, {"exit": 3}, "'status' is missing"),
        (Exit, {"exit": True, "status": 9}, "'exit' must be int, not bool"),
        (Unowned, {"unowned": 1, "pids": [1, "2"]}, "'pids' must be a list of int"),
        (SpareLease, {"spare": 1, "ns_pid": 1, "confinement": []}, "'confinement' must be dict"),
        (SpareLease, {"spare": 1, "confinement": {}}, "'ns_pid' is missing"),
        (SpareLease, {"spare": 1, "ns_pid": 1, "confinement": {}, "notes": [1]}, "'notes' must be a list of str"),
        (SpareBack, {"spare": 5}, "'spare' must be bool"),
        (SpareBack, {"spare": False}, "'spare' must be true"),
        (SpawnRequest, {"op": "spawn", "id": 1, "sid": 2, "spec": _SPEC, "stdio": "0123"}, "'stdio' must be list"),
        (SpawnRequest, {"op": "spawn", "id": 1, "sid": 2, "spec": _SPEC, "stdio": [0.5]}, "'stdio' must be a list"),
        (SpawnRequest, {"op": "spawn", "id": 1, "spec": _SPEC, "stdio": [0]}, "'sid' is missing"),
        (SpawnRequest, {"op": "spawn", "id": 1, "sid": 2, "spec": None, "stdio": [0]}, "'spec' must be dict"),
        (SpawnRequest, {"id": 1, "sid": 2, "spec": _SPEC, "stdio": [0], "notify": "4"}, "'notify' must be int"),
        (SpawnRequest, {"id": 1, "sid": 2, "spec": _SPEC, "stdio": [0], "own_pidns": 1}, "'own_pidns' must be bool"),
        (SpawnRequest, [], "not an object"),
        (ErrorReply, {"id": 1, "ok": False, "errno": "2"}, "'errno' must be int"),
        (ErrorReply, [1], "not an object"),
        (SpawnReply, {"id": 1, "ok": True, "pid": 2}, "'ns_pid' is missing"),
        (SpawnReply, {"id": 1, "ok": True, "pid": "2", "ns_pid": 1}, "'pid' must be int"),
        (PrepareReply, {"id": 1, "ok": True, "fd_names": ["a", 2]}, "'fd_names' must be a list of str"),
        (PrepareReply, {"id": 1, "ok": True, "report": []}, "'report' must be dict"),
        (PingReply, {"id": 1, "ok": True}, "'pid' is missing"),
        (Ready, {"ready": "yes"}, "'ready' must be bool"),
        (Ready, {"ready": False, "errno": "EPERM"}, "'errno' must be int"),
    ],
)
def test_from_wire_refuses_a_malformed_message_naming_the_field(kind: Any, data: Any, field: str) -> None:
    with pytest.raises(MessageError, match=field):
        kind.from_wire(json.loads(json.dumps(data)))


def test_a_message_error_is_a_value_error() -> None:
    """The readers (the init's spawn, a spare's command) answer a ValueError with an error, not a crash."""
    assert issubclass(MessageError, ValueError)


@pytest.mark.parametrize(
    "request_",
    [
        Ping(1),
        Prepare(2, NamespacePlan(PrivilegeModel.U, agent_ids=(1000, 1000))),
        CaptureCall(3, "inspect"),
        SocketRequest(4, 10, 2, 17),
        KillAll(5),
        SpawnRequest(_SPEC, (0, 1, 2, 3), 6, 7),
    ],
    ids=lambda r: type(r).__name__,
)
def test_a_request_is_read_back_as_its_own_kind_by_its_op(request_: Any) -> None:
    data, _ = wire.decode(wire.encode(request_.to_wire()), [], 0)
    assert request_from_wire(data) == request_


@pytest.mark.parametrize(
    ("data", "text"),
    [
        ({"op": "fork_bomb", "id": 1}, "unknown op 'fork_bomb'"),
        ({"id": 1}, "unknown op None"),
        ({"op": ["ping"], "id": 1}, r"unknown op \['ping'\]"),
        ([], "request: not an object"),
        ({"op": "ping"}, "ping: field 'id' is missing"),
        ({"op": "ping", "id": "1"}, "ping: field 'id' must be int"),
        ({"op": "socket", "id": 1, "family": 2}, "socket request: field 'type' is missing"),
        ({"op": "socket", "id": 1, "family": 2, "type": 1, "proto": "tcp"}, "field 'proto' must be int"),
        ({"op": "capture_call", "id": 1, "fn": 3}, "capture call: field 'fn' must be str"),
        ({"op": "capture_call", "id": 1, "fn": "probe", "args": []}, "capture call: field 'args' must be dict"),
        ({"op": "prepare", "id": 1, "plan": {}}, "prepare: field 'plan': KeyError"),
        ({"op": "prepare", "id": 1, "plan": {"model": "X", "netns": 1, "pidns": 1, "mountns": 1, "hide_paths": [],
                                             "capture": None, "agent_ids": None}}, "prepare: field 'plan'"),
        ({"op": "spawn", "sid": 2, "spec": _SPEC, "stdio": [0]}, "spawn request: field 'id' is missing"),
    ],
)  # fmt: skip
def test_a_malformed_or_unknown_request_is_refused_naming_what(data: Any, text: str) -> None:
    with pytest.raises(MessageError, match=text):
        request_from_wire(data)
