"""The attach descriptor's static policy (supervisor/protocol/attach.py rule 3): what control's policy model writes
is what the boundary reads back, field for field, and anything else is ``invalid`` naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.control.policy import load_policy_text
from supervisor.protocol.attach import (
    AttachRequest,
    CaptureMode,
    FilesystemSection,
    ProcessSection,
    StaticPolicy,
    parse_attach,
)
from supervisor.protocol.errors import ErrorKind, OpError
from tests.certs_fixtures import SAMPLE_CLAIMS

POLICY = """\
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /etc]
  read_write: [/data]
landlock:
  compatibility: hard_requirement
process:
  run_as_user: sandbox
  run_as_group: sandbox
"""


@pytest.mark.parametrize("text", [POLICY, "version: 1\n", "version: 1\nprocess: {}\nlandlock: {}\n"])
def test_control_writes_what_the_boundary_reads(text: str) -> None:
    wire = load_policy_text(text).static_json()
    static = StaticPolicy.from_wire(wire)
    assert static.to_wire() == wire


def test_sections_are_typed() -> None:
    static = StaticPolicy.from_wire(load_policy_text(POLICY).static_json())
    assert static.filesystem == FilesystemSection(True, ("/usr", "/etc"), ("/data",))
    assert static.landlock_compatibility == "hard_requirement"
    assert static.process == ProcessSection("sandbox", "sandbox")
    assert StaticPolicy.from_wire({}) == StaticPolicy()


def test_descriptor_round_trip() -> None:
    static = StaticPolicy.from_wire(load_policy_text(POLICY).static_json())
    sent = AttachRequest(
        sandbox=SAMPLE_CLAIMS.sandbox,
        network_policy=SAMPLE_CLAIMS.network_policy,
        capture_mode=CaptureMode.NETNS,
        static_policy=static,
        credential_placeholders={"GITHUB_TOKEN": "openshell-placeholder-1"},
    )
    assert parse_attach(sent.to_wire(), SAMPLE_CLAIMS) == sent


@pytest.mark.parametrize(
    ("static", "field"),
    [
        ([], "static_policy"),
        ({"network_policies": {}}, "static_policy.network_policies"),
        ({"filesystem_policy": {"read_only": "/usr"}}, "static_policy.filesystem_policy.read_only"),
        ({"filesystem_policy": {"read_write": [1]}}, "static_policy.filesystem_policy.read_write"),
        ({"filesystem_policy": {"include_workdir": "yes"}}, "static_policy.filesystem_policy.include_workdir"),
        ({"filesystem_policy": {"mounts": []}}, "static_policy.filesystem_policy.mounts"),
        ({"landlock": {"compatibility": "off"}}, "static_policy.landlock.compatibility"),
        ({"process": {"run_as_user": 0}}, "static_policy.process.run_as_user"),
    ],
)
def test_a_bad_static_policy_is_invalid_naming_the_field(static: Any, field: str) -> None:
    body = AttachRequest(sandbox=SAMPLE_CLAIMS.sandbox, network_policy=SAMPLE_CLAIMS.network_policy).to_wire()
    with pytest.raises(OpError) as info:
        parse_attach({**body, "static_policy": static}, SAMPLE_CLAIMS)
    assert info.value.kind is ErrorKind.INVALID and info.value.field == field
