"""Small builders shared by the policy tests (not a test module)."""

from __future__ import annotations

from typing import Any

import yaml

from supervisor.control.policy import (
    BinaryIdentity,
    CompiledPolicy,
    Decision,
    L4Request,
    Policy,
    compile_policy,
    decide_l4,
    load_policy_text,
)

GIT = "/usr/bin/git"
CURL = "/usr/bin/curl"
PY = "/usr/bin/python3"


def doc(rules: dict[str, Any], **top: Any) -> str:
    body: dict[str, Any] = {"version": 1, **top, "network_policies": rules}
    return yaml.safe_dump(body, sort_keys=False)


def rule(*endpoints: dict[str, Any], binaries: tuple[str, ...] = (GIT,), **extra: Any) -> dict[str, Any]:
    return {**extra, "endpoints": list(endpoints), "binaries": [{"path": b} for b in binaries]}


def load(rules: dict[str, Any], **top: Any) -> Policy:
    return load_policy_text(doc(rules, **top), "test.yaml")


def compiled(rules: dict[str, Any], **top: Any) -> CompiledPolicy:
    return compile_policy(load(rules, **top))


def who(path: str = GIT, *ancestors: str, sha: str | None = None, cmdline: tuple[str, ...] = ()) -> BinaryIdentity:
    return BinaryIdentity(path, sha, tuple(ancestors), cmdline)


def l4(policy: CompiledPolicy, host: str, port: int = 443, identity: BinaryIdentity | None = None) -> Decision:
    return decide_l4(policy, L4Request(host, port, identity if identity is not None else who()))
