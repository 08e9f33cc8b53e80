"""The launcher wire (``boundary.forkimage.zygote``): one JSON object per message, and the spawn request a spare
exec-init or the workload's init reads from it.

Oracles beyond "no crash":

* ``decode`` returns an object or raises ``OSError`` (the receivers treat that as a dead or broken peer);
* reading a spawn request raises only what its readers handle (``KeyError``, ``TypeError``, ``ValueError``,
  ``OSError``: the exec-init answers 127 and the init replies an error); ``validate`` and ``confinement`` of a
  spec that was read never raise;
* a request the zygote reads (``request_from_wire``) is refused only with a ``MessageError`` and round-trips;
* a spawn request or a namespace plan that is read round-trips through ``to_wire``.
"""

from __future__ import annotations

from supervisor.boundary.forkimage import child, messages, wire
from supervisor.protocol.json_value import is_json_object

_HANDLED = (KeyError, TypeError, ValueError, OSError)


def one_input(data: bytes) -> None:
    try:
        message, fds = wire.decode(data, [], 0)
    except OSError:
        return
    assert isinstance(message, dict) and fds == []
    try:
        typed = messages.request_from_wire(message)
    except messages.MessageError:
        typed = None
    if typed is not None:
        assert messages.request_from_wire(typed.to_wire()) == typed, typed
    try:
        request = messages.SpawnRequest.from_wire(message)
    except _HANDLED:
        request = None
    if request is not None:
        assert messages.SpawnRequest.from_wire(request.to_wire()) == request, request
    try:
        raw_spec = message["spec"]
        spec = child.SpawnSpec.from_wire(raw_spec) if is_json_object(raw_spec) else None
    except _HANDLED:
        spec = None
    if spec is not None and child.validate(spec) is None:
        child.confinement(spec, False)
    try:
        raw_plan = message["plan"]
        if not is_json_object(raw_plan):
            return
        plan = messages.NamespacePlan.from_wire(raw_plan)
    except _HANDLED:
        return
    plan.effective()
    again = messages.NamespacePlan.from_wire(plan.to_wire())
    assert again == plan, (again, plan)
