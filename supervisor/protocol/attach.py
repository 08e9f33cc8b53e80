"""The ``attach`` descriptor: what control tells the boundary when it binds it (docs/design.md "Who says what at
attach"; docs/reference/boundary.md §1.2).

Rule 1: the agent's argv, cwd and tty are NOT here — they come from the boundary's own command line.
Rule 2: strict: unknown keys, wrong types and a version other than exactly ours are ``invalid``; a descriptor
that contradicts the certificate claims (sandbox, NetworkPolicy) is ``denied``.
Rule 3: ``static_policy`` is the policy's static sections (docs/reference/policy.md §1: ``filesystem_policy``,
``landlock``, ``process``) as control's policy model writes them; the boundary holds them as a
:class:`StaticPolicy`, checked as strictly as the rest (``invalid`` naming ``static_policy.<section>.<key>``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from supervisor.protocol.claims import Claims
from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.fence_canary import parse_canary
from supervisor.protocol.json_value import JsonValue, is_json_object
from supervisor.protocol.lifecycle import State, reported_state

BACKEND_NAME = "openshell.boundary"
CONTRACT_VERSION = 2  # 2: fence_canary and acknowledge_unprobed_fence (protocol/fence_canary.py)


class CaptureMode(enum.StrEnum):
    NETNS = "netns"
    PROXY_ENV = "proxy-env"


@dataclass(frozen=True, slots=True)
class FilesystemSection:
    include_workdir: bool = False
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessSection:
    run_as_user: str | None = None  # "sandbox" or a decimal id
    run_as_group: str | None = None


@dataclass(frozen=True, slots=True)
class StaticPolicy:
    """The static sections of the policy, as the boundary applies them (rule 3); ``None``: the section is absent."""

    filesystem: FilesystemSection | None = None
    landlock_compatibility: str | None = None  # "best_effort" | "hard_requirement"
    process: ProcessSection | None = None

    def to_wire(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {}
        if self.filesystem is not None:
            body["filesystem_policy"] = {
                "include_workdir": self.filesystem.include_workdir,
                "read_only": list(self.filesystem.read_only),
                "read_write": list(self.filesystem.read_write),
            }
        if self.landlock_compatibility is not None:
            body["landlock"] = {"compatibility": self.landlock_compatibility}
        if self.process is not None:
            fields = (("run_as_user", self.process.run_as_user), ("run_as_group", self.process.run_as_group))
            body["process"] = {name: value for name, value in fields if value is not None}
        return body

    def effective(self) -> StaticPolicy:
        """What the boundary applies, with the spellings that apply the same made equal: a filesystem section with
        nothing in ``read_only`` and ``read_write`` is the default filesystem (``boundary/confinement.py`` rule 2;
        its ``include_workdir`` then changes nothing), ``best_effort`` Landlock is the default, and an empty
        ``process`` section is no section. Two policies whose static sections differ only in these spellings run
        the same sandbox."""
        fs = self.filesystem
        if fs is not None and not fs.read_only and not fs.read_write:
            fs = None
        landlock = None if self.landlock_compatibility in (None, "best_effort") else self.landlock_compatibility
        process = self.process
        if process is not None and process.run_as_user is None and process.run_as_group is None:
            process = None
        return StaticPolicy(filesystem=fs, landlock_compatibility=landlock, process=process)

    @classmethod
    def from_wire(cls, obj: object) -> StaticPolicy:
        """Raises :class:`OpError` ``invalid`` naming the field at fault."""
        top = _section(obj, "static_policy", {"filesystem_policy", "landlock", "process"})
        filesystem = None
        if "filesystem_policy" in top:
            fs = _section(top["filesystem_policy"], "static_policy.filesystem_policy",
                          {"include_workdir", "read_only", "read_write"})  # fmt: skip
            include = fs.get("include_workdir", False)
            if not isinstance(include, bool):
                raise _invalid("must be a boolean", "static_policy.filesystem_policy.include_workdir")
            filesystem = FilesystemSection(
                include_workdir=include,
                read_only=_paths(fs, "read_only"),
                read_write=_paths(fs, "read_write"),
            )
        compatibility = None
        if "landlock" in top:
            landlock = _section(top["landlock"], "static_policy.landlock", {"compatibility"})
            raw = landlock.get("compatibility", "best_effort")
            if raw not in ("best_effort", "hard_requirement"):
                raise _invalid("must be best_effort or hard_requirement", "static_policy.landlock.compatibility")
            compatibility = str(raw)
        process = None
        if "process" in top:
            section = _section(top["process"], "static_policy.process", {"run_as_user", "run_as_group"})
            for name, value in section.items():
                if not isinstance(value, str):
                    raise _invalid("must be a string", f"static_policy.process.{name}")
            process = ProcessSection(
                run_as_user=_text_or_none(section, "run_as_user"), run_as_group=_text_or_none(section, "run_as_group")
            )
        return cls(filesystem=filesystem, landlock_compatibility=compatibility, process=process)


def _section(obj: object, where: str, known: set[str]) -> Mapping[str, object]:
    if not isinstance(obj, Mapping):
        raise _invalid("must be a JSON object", where)
    for name in obj:
        if name not in known:
            raise _invalid(f"unknown field {name!r}", f"{where}.{name}")
    return obj


def _text_or_none(section: Mapping[str, object], name: str) -> str | None:
    value = section.get(name)
    return value if isinstance(value, str) else None


def _paths(section: Mapping[str, object], name: str) -> tuple[str, ...]:
    value = section.get(name, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _invalid("must be a list of paths", f"static_policy.filesystem_policy.{name}")
    return tuple(value)


@dataclass(frozen=True)
class AttachRequest:
    sandbox: str
    network_policy: str
    capture_mode: CaptureMode = CaptureMode.NETNS
    agent_uid: int = 1000
    agent_gid: int = 1000
    policy_generation: int = 0
    static_policy: StaticPolicy = StaticPolicy()
    interception_ca_pem: str | None = None
    credential_placeholders: dict[str, str] = field(default_factory=dict)
    acknowledge_external_fence: bool = False
    # proxy-env: where control's canary listens ("ADDR:PORT", from control's own flags; protocol/fence_canary.py),
    # or None, allowed only when the acknowledgement also says "no probe"
    fence_canary: str | None = None
    acknowledge_unprobed_fence: bool = False
    capture_ports: tuple[int, ...] = (80, 443)
    backend_name: str = BACKEND_NAME
    version: int = CONTRACT_VERSION

    def to_wire(self) -> dict[str, JsonValue]:
        """The descriptor as control sends it (``parse_attach`` reads it back against the claims)."""
        return {
            "sandbox": self.sandbox,
            "network_policy": self.network_policy,
            "capture_mode": str(self.capture_mode),
            "agent_uid": self.agent_uid,
            "agent_gid": self.agent_gid,
            "policy_generation": self.policy_generation,
            "static_policy": self.static_policy.to_wire(),
            "interception_ca_pem": self.interception_ca_pem,
            "credential_placeholders": dict(self.credential_placeholders),
            "acknowledge_external_fence": self.acknowledge_external_fence,
            "fence_canary": self.fence_canary,
            "acknowledge_unprobed_fence": self.acknowledge_unprobed_fence,
            "capture_ports": list(self.capture_ports),
            "backend_name": self.backend_name,
            "version": self.version,
        }

    @classmethod
    def from_wire(cls, obj: object) -> AttachRequest:
        """The descriptor's schema; whether it names our sandbox is :func:`check_claims`'s to say (the boundary
        reads it with :class:`AttachReader`, which checks both)."""
        return _from_wire(obj, None)


_TYPES: dict[str, type | tuple[type, ...]] = {
    "sandbox": str,
    "network_policy": str,
    "capture_mode": str,
    "agent_uid": int,
    "agent_gid": int,
    "policy_generation": int,
    "static_policy": dict,
    "interception_ca_pem": (str, type(None)),
    "credential_placeholders": dict,
    "acknowledge_external_fence": bool,
    "fence_canary": (str, type(None)),
    "acknowledge_unprobed_fence": bool,
    "capture_ports": list,
    "backend_name": str,
    "version": int,
}
_REQUIRED = ("backend_name", "version", "sandbox", "network_policy")


def _invalid(reason: str, name: str) -> OpError:
    return OpError(ErrorKind.INVALID, reason, field=name)


def parse_attach(body: object, claims: Claims) -> AttachRequest:
    """Validate an attach body against the schema and against the bound claims."""
    return _from_wire(body, claims)


def check_claims(attach: AttachRequest, claims: Claims) -> AttachRequest:
    """The descriptor names the sandbox and the NetworkPolicy of the boundary's own claims, or is ``denied``."""
    if attach.sandbox != claims.sandbox:
        raise OpError(ErrorKind.DENIED, "descriptor names another sandbox than the claims", field="sandbox")
    if attach.network_policy != claims.network_policy:
        raise OpError(ErrorKind.DENIED, "descriptor names another NetworkPolicy", field="network_policy")
    return attach


@dataclass(frozen=True)
class AttachReader:
    """``/v1/attach``'s request type on the boundary: reads a descriptor against the boundary's own claims, in
    :func:`parse_attach`'s order (the claims are checked before the static policy is read)."""

    claims: Claims

    def from_wire(self, obj: object) -> AttachRequest:
        return parse_attach(obj, self.claims)


def _from_wire(body: object, claims: Claims | None) -> AttachRequest:
    """The descriptor's schema; with ``claims``, the names it must share with them too."""
    if not isinstance(body, dict):
        raise _invalid("attach descriptor must be a JSON object", "descriptor")
    for name in body:
        if name not in _TYPES:
            raise _invalid(f"unknown field {name!r}", name)
    for name in _REQUIRED:
        if name not in body:
            raise _invalid(f"missing field {name!r}", name)
    for name, value in body.items():
        expected = _TYPES[name]
        if isinstance(value, bool) and expected is int:
            raise _invalid(f"{name} must be an integer", name)
        if not isinstance(value, expected):
            raise _invalid(f"{name} has the wrong type", name)
    if body["backend_name"] != BACKEND_NAME:
        raise _invalid(f"backend {body['backend_name']!r} is not {BACKEND_NAME!r}", "backend_name")
    if body["version"] != CONTRACT_VERSION:
        raise _invalid(f"contract version {body['version']} is not {CONTRACT_VERSION}", "version")
    try:
        mode = CaptureMode(body.get("capture_mode", CaptureMode.NETNS))
    except ValueError:
        raise _invalid(f"capture_mode must be one of {[m.value for m in CaptureMode]}", "capture_mode") from None
    for name in ("agent_uid", "agent_gid"):
        if not 0 <= body.get(name, 1000) < 2**32 - 1:
            raise _invalid(f"{name} out of range", name)
    if body.get("policy_generation", 0) < 0:
        raise _invalid("policy_generation must be >= 0", "policy_generation")
    ports = body.get("capture_ports", [80, 443])
    if not ports or not all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports):
        raise _invalid("capture_ports must be a non-empty list of ports 1..65535", "capture_ports")
    placeholders = body.get("credential_placeholders", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in placeholders.items()):
        raise _invalid("credential_placeholders must map names to strings", "credential_placeholders")
    canary = body.get("fence_canary")
    if canary is not None:
        try:
            parse_canary(canary)
        except ValueError as exc:
            raise _invalid(f"fence_canary: {exc}", "fence_canary") from None
    if claims is not None:
        check_claims(AttachRequest(body["sandbox"], body["network_policy"]), claims)
    return AttachRequest(
        sandbox=body["sandbox"],
        network_policy=body["network_policy"],
        capture_mode=mode,
        agent_uid=body.get("agent_uid", 1000),
        agent_gid=body.get("agent_gid", 1000),
        policy_generation=body.get("policy_generation", 0),
        static_policy=StaticPolicy.from_wire(body.get("static_policy", {})),
        interception_ca_pem=body.get("interception_ca_pem"),
        credential_placeholders=dict(placeholders),
        acknowledge_external_fence=body.get("acknowledge_external_fence", False),
        fence_canary=canary,
        acknowledge_unprobed_fence=body.get("acknowledge_unprobed_fence", False),
        capture_ports=tuple(sorted(set(ports))),
    )


@dataclass(frozen=True)
class AttachReply:
    """``/v1/attach``'s answer: Bound, by which boundary, and how its capture was set up. ``capture`` is the
    capture set-up's own report (mode, addresses, routes, listeners), passed on whole for control's event. A field
    a peer left out stays out (``None``)."""

    state: State
    boundary_instance: str | None = None
    privilege_model: str | None = None
    capture: dict[str, JsonValue] | None = None

    def to_wire(self) -> dict[str, JsonValue]:
        wire: dict[str, JsonValue] = {"state": str(self.state)}
        if self.boundary_instance is not None:
            wire["boundary_instance"] = self.boundary_instance
        if self.privilege_model is not None:
            wire["privilege_model"] = self.privilege_model
        if self.capture is not None:
            wire["capture"] = self.capture
        return wire

    @classmethod
    def from_wire(cls, obj: object) -> AttachReply:
        if not isinstance(obj, dict):
            raise OpError(ErrorKind.INVALID, "the attach reply must be a JSON object")
        instance, model, capture = obj.get("boundary_instance"), obj.get("privilege_model"), obj.get("capture")
        if instance is not None and not isinstance(instance, str):
            raise _invalid("the attach reply's boundary_instance must be a string", "boundary_instance")
        if model is not None and not isinstance(model, str):
            raise _invalid("the attach reply's privilege_model must be a string", "privilege_model")
        if capture is not None and not is_json_object(capture):
            raise _invalid("the attach reply's capture must be an object", "capture")
        return cls(reported_state(obj.get("state")), instance, model, capture)
