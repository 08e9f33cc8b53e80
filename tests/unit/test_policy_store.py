"""Generations and failure modes (docs/reference/policy.md §3.15, docs/design.md "Settled details"), without a file
watcher."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from supervisor.control.policy import (
    DenyReason,
    L4Request,
    PolicyInvalid,
    PolicySnapshot,
    PolicyStore,
    compile_policy,
    load_default_policy,
)

from .policy_helpers import doc, load, rule, who

V1 = doc({"a": rule({"host": "a.example.com", "port": 443})})
V2 = doc({"a": rule({"host": "a.example.com", "port": 443}), "b": rule({"host": "b.example.com", "port": 443})})
INVALID = doc({"a": rule({"host": "*", "port": 443})})


def make(failure_mode: str = "fail-closed") -> PolicyStore:
    return PolicyStore(
        compile_policy(load({"a": rule({"host": "a.example.com", "port": 443})})),
        failure_mode=failure_mode,
        source="initial",
    )  # type: ignore[arg-type]


def allowed(store: PolicyStore, host: str) -> bool:
    return store.snapshot().decide_l4(L4Request(host, 443, who())).allowed


def test_starts_at_generation_zero() -> None:
    store = make()
    assert (store.generation, store.status, store.last_error, store.ready) == (0, "loaded", None, True)
    assert store.status_json()["generation"] == 0


def test_valid_apply_bumps_generation() -> None:
    store = make()
    assert store.apply_text(V2, "api") == 1
    assert allowed(store, "b.example.com") and store.status_json()["source"] == "api"


def test_same_content_does_not_bump() -> None:
    store = make()
    assert store.apply_text(V1, "api") == 0
    assert store.apply_text("# reformatted\n" + V1, "api") == 0


def test_invalid_apply_changes_nothing() -> None:
    store = make()
    before = store.snapshot()
    with pytest.raises(PolicyInvalid) as info:
        store.apply_text(INVALID, "api")
    assert info.value.errors[0].path == "network_policies.a.endpoints[0].host"
    assert store.snapshot() is before


def test_invalid_file_quarantines_by_default() -> None:
    store = make()
    seen: list[PolicySnapshot] = []
    store.subscribe(seen.append)
    assert store.disk_revision(INVALID, "p.yaml") == 1
    assert (store.status, store.current, store.ready) == ("quarantined", None, False)
    d = store.snapshot().decide_l4(L4Request("a.example.com", 443, who()))
    assert d.reason is DenyReason.POLICY_QUARANTINED
    status = store.status_json()
    assert status["status"] == "quarantined" and status["errors"][0]["path"].endswith(".host")
    assert status["hash"] is None and status["last_valid_hash"]
    # a second invalid revision stays in the same quarantine generation
    assert store.disk_revision(INVALID + "\n# again\n", "p.yaml") == 1
    # the last valid policy again leaves quarantine: a new generation
    assert store.disk_revision(V1, "p.yaml") == 2
    assert store.status == "loaded" and allowed(store, "a.example.com")
    assert [s.generation for s in seen] == [1, 1, 2]


def test_retain_last_valid() -> None:
    store = make("retain-last-valid")
    assert store.disk_revision(INVALID, "p.yaml") == 0
    assert (store.status, store.ready) == ("retained", True)
    assert allowed(store, "a.example.com")
    assert store.last_error is not None and "matches all hosts" in store.last_error[0].message
    # the valid file back: healthy again, same generation (nothing decisions see changed)
    assert store.disk_revision(V1, "p.yaml") == 0
    assert (store.status, store.last_error) == ("loaded", None)
    assert store.disk_revision(V2, "p.yaml") == 1


def test_file_changed_reads_the_file(tmp_path: Path) -> None:
    store = make()
    path = tmp_path / "policy.yaml"
    path.write_text(V2)
    assert store.file_changed(path) == 1
    path.unlink()
    assert store.file_changed(path) == 2 and store.status == "quarantined"
    assert "cannot read" in (store.last_error or [])[0].message


def test_first_tcp_endpoint_cannot_be_added_by_reload() -> None:
    store = make()
    tcp = doc({"a": rule({"host": "git.example.com", "port": 22, "protocol": "tcp"})})
    with pytest.raises(PolicyInvalid, match="protocol: tcp"):
        store.apply_text(tcp, "api")
    assert store.generation == 0
    started_with_tcp = PolicyStore(
        compile_policy(load({"a": rule({"host": "g.example.com", "port": 22, "protocol": "tcp"})})), source="x"
    )
    assert started_with_tcp.apply_text(tcp, "api") == 1


def test_static_sections_change_warns() -> None:
    store = make()
    store.apply_text(doc({"a": rule({"host": "a.example.com", "port": 443})}, process={"run_as_user": 1000}), "api")
    assert any("static sections" in w["message"] for w in store.status_json()["warnings"])


def test_a_network_only_revision_of_the_default_policy_warns_of_no_static_change() -> None:
    store = PolicyStore(compile_policy(load_default_policy()), source="default")
    store.apply_text(V2, "api")  # no static sections at all: the same sandbox as the default's empty ones
    assert store.generation == 1 and "warnings" not in store.status_json()
    store.apply_text(doc({"a": rule({"host": "a.example.com", "port": 443})}, landlock={"compatibility":
                     "best_effort"}, filesystem_policy={"include_workdir": True}), "api")  # fmt: skip
    assert store.generation == 2 and "warnings" not in store.status_json()
    store.apply_text(doc({"a": rule({"host": "a.example.com", "port": 443})}, filesystem_policy={
        "include_workdir": True, "read_only": ["/usr"]}), "api")  # fmt: skip
    assert any("static sections" in w["message"] for w in store.status_json()["warnings"])


def test_unsubscribe_and_failing_subscriber() -> None:
    store = make()
    calls: list[int] = []
    unsubscribe = store.subscribe(lambda s: calls.append(s.generation))

    def broken(_: PolicySnapshot) -> None:
        raise RuntimeError("subscriber bug")

    store.subscribe(broken)
    with pytest.raises(RuntimeError):
        store.apply_text(V2, "api")
    assert store.generation == 1 and calls == [1]  # the change happened and others were told
    unsubscribe()
    with pytest.raises(RuntimeError):
        store.apply_text(V1, "api")
    assert calls == [1]


def test_is_current_tells_stale_connections() -> None:
    store = make()
    admitted = store.generation
    store.apply_text(V2, "api")
    assert not store.is_current(admitted) and store.is_current(store.generation)


def test_unknown_failure_mode_refused() -> None:
    with pytest.raises(ValueError):
        make("fail-open")


async def test_wait_for_change() -> None:
    store = make()
    results: list[int] = []

    async def waiter() -> None:
        results.append((await store.wait_for_change(0)).generation)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert results == []
        store.apply_text(V2, "api")
    assert results == [1]
    assert (await store.wait_for_change(0)).generation == 1  # already different: returns at once


async def test_apply_text_async() -> None:
    store = make()
    assert await store.apply_text_async(V2, "api") == 1
    with pytest.raises(PolicyInvalid):
        await store.apply_text_async(INVALID, "api")
    assert store.generation == 1 and store.status == "loaded"
