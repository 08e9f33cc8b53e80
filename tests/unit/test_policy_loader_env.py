"""``allow_loader_env`` (docs/design.md "Identity"): a process started with loader variables matches only binary
entries that opt in, by its own path or an ancestor's; validation locates a bad value; the digest of a policy
without the key is unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from supervisor.control.policy import BinaryIdentity, DenyReason, PolicyInvalid, Verdict, load_policy_text

from .policy_helpers import CURL, GIT, compiled, doc, l4, load, rule

EP = {"host": "api.example.com", "port": 443}


def with_binaries(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"r": {"endpoints": [EP], "binaries": list(entries)}}


def preloaded(path: str = CURL, *ancestors: str, env: tuple[str, ...] = ("LD_PRELOAD",)) -> BinaryIdentity:
    return BinaryIdentity(path, None, tuple(ancestors), (), env)


def test_loader_env_voids_a_binary_match_unless_the_entry_opts_in() -> None:
    plain = compiled(with_binaries({"path": CURL}))
    assert l4(plain, "api.example.com", identity=BinaryIdentity(CURL, None)).verdict is Verdict.ALLOW
    for env in (("LD_PRELOAD",), ("LD_AUDIT",), ("LD_LIBRARY_PATH",)):
        denied = l4(plain, "api.example.com", identity=preloaded(env=env))
        assert denied.reason is DenyReason.BINARY_NOT_ALLOWED
        assert f"started with {env[0]}: only binaries with allow_loader_env match" in denied.detail
    opted = compiled(with_binaries({"path": CURL, "allow_loader_env": True}))
    assert l4(opted, "api.example.com", identity=preloaded()).verdict is Verdict.ALLOW


def test_ancestors_and_globs_follow_the_same_rule() -> None:
    policy = compiled(with_binaries({"path": "/usr/bin/*", "allow_loader_env": False}, {"path": GIT}))
    assert l4(policy, "api.example.com", identity=preloaded("/tmp/x", GIT)).verdict is Verdict.DENY
    assert l4(policy, "api.example.com", identity=preloaded(CURL)).verdict is Verdict.DENY
    opted = compiled(with_binaries({"path": "/usr/bin/*", "allow_loader_env": True}))
    assert l4(opted, "api.example.com", identity=preloaded("/tmp/x", CURL)).verdict is Verdict.ALLOW


@pytest.mark.parametrize("value", ["yes please", 1, None])
def test_a_non_boolean_is_located(value: object) -> None:
    with pytest.raises(PolicyInvalid) as info:
        load(with_binaries({"path": CURL, "allow_loader_env": value}))
    assert [e.path for e in info.value.errors] == ["network_policies.r.binaries[0].allow_loader_env"]
    assert info.value.errors[0].line is not None


def test_the_key_round_trips_and_leaves_other_digests_alone() -> None:
    before = load({"r": rule(EP, binaries=(CURL,))})
    explicit_false = load(with_binaries({"path": CURL, "allow_loader_env": False}))
    assert explicit_false.digest == before.digest
    opted = load(with_binaries({"path": CURL, "allow_loader_env": True}))
    assert opted.digest != before.digest
    again = load_policy_text(doc({"r": opted.to_json()["network_policies"]["r"]}), "again.yaml")
    assert again.digest == opted.digest
    assert yaml.safe_dump(opted.to_json()).count("allow_loader_env: true") == 1
