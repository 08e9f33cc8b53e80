"""Hot reload from a real policy file: generations, failure modes, editor-style saves, stale connections."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import trio

from supervisor.control.policy import (
    BinaryIdentity,
    DenyReason,
    L4Request,
    PolicyFileWatcher,
    PolicySnapshot,
    PolicyStore,
    compile_policy,
    load_policy_file,
    watch_policy_file,
)

GIT = BinaryIdentity("/usr/bin/git", None)


def policy_text(*hosts: str) -> str:
    endpoints = "".join(f"      - {{host: {h}, port: 443}}\n" for h in hosts)
    return f"version: 1\nnetwork_policies:\n  r:\n    endpoints:\n{endpoints}    binaries: [{{path: /usr/bin/git}}]\n"


INVALID = "version: 1\nnetwork_policies:\n  r:\n    endpoints: [{host: '*', port: 443}]\n    binaries: []\n"


def setup(tmp_path: Path, mode: str = "fail-closed") -> tuple[Path, PolicyStore, PolicyFileWatcher]:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text("a.example.com"))
    store = PolicyStore(
        compile_policy(load_policy_file(path)),
        failure_mode=mode,  # type: ignore[arg-type]
        source=str(path),
    )
    return path, store, PolicyFileWatcher(path, store, rehash_every=5)


def allows(store: PolicyStore, host: str) -> bool:
    return store.snapshot().decide_l4(L4Request(host, 443, GIT)).allowed


def replace(path: Path, text: str) -> None:
    """The way editors and ConfigMap updates save: a new file renamed over the old one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def test_valid_edit_becomes_the_next_generation(tmp_path: Path) -> None:
    path, store, watcher = setup(tmp_path)
    assert await watcher.poll()  # first look: same content as the store, nothing changes
    assert store.generation == 0
    assert not await watcher.poll()
    replace(path, policy_text("a.example.com", "b.example.com"))
    assert await watcher.poll()
    assert store.generation == 1 and allows(store, "b.example.com")
    # rewriting identical content (new inode, same bytes) changes nothing
    replace(path, policy_text("a.example.com", "b.example.com"))
    assert not await watcher.poll()
    assert store.generation == 1


async def test_invalid_file_quarantines_after_confirmation_then_recovers(tmp_path: Path) -> None:
    path, store, watcher = setup(tmp_path)
    await watcher.poll()
    replace(path, INVALID)
    assert not await watcher.poll()  # seen once: could be a save in progress
    assert store.status == "loaded"
    assert await watcher.poll()  # still there: the failure mode applies
    assert (store.status, store.generation) == ("quarantined", 1)
    d = store.snapshot().decide_l4(L4Request("a.example.com", 443, GIT))
    assert d.reason is DenyReason.POLICY_QUARANTINED and "matches all hosts" in d.detail
    errors = store.status_json()["errors"]
    assert errors[0]["line"] == 4 and errors[0]["source"] == str(path)
    replace(path, policy_text("a.example.com"))
    assert await watcher.poll()
    assert (store.status, store.generation) == ("loaded", 2) and allows(store, "a.example.com")


async def test_half_written_save_does_not_flap(tmp_path: Path) -> None:
    path, store, watcher = setup(tmp_path)
    await watcher.poll()
    full = policy_text("a.example.com", "c.example.com")
    path.write_text(full[: len(full) // 2])  # truncated write in progress
    assert not await watcher.poll()
    path.write_text(full)
    assert await watcher.poll()
    assert (store.status, store.generation) == ("loaded", 1) and allows(store, "c.example.com")


async def test_retain_last_valid_keeps_deciding(tmp_path: Path) -> None:
    path, store, watcher = setup(tmp_path, "retain-last-valid")
    await watcher.poll()
    replace(path, INVALID)
    await watcher.poll()
    await watcher.poll()
    assert (store.status, store.generation) == ("retained", 0) and allows(store, "a.example.com")
    assert store.status_json()["errors"]


async def test_deleted_file_is_an_invalid_revision(tmp_path: Path) -> None:
    path, store, watcher = setup(tmp_path)
    await watcher.poll()
    path.unlink()
    await watcher.poll()
    await watcher.poll()
    assert store.status == "quarantined"
    assert "cannot read" in store.status_json()["errors"][0]["message"]


async def test_in_place_edit_with_restored_mtime_is_found_by_rehash(tmp_path: Path) -> None:
    path, store, watcher = setup(tmp_path)
    await watcher.poll()
    st = os.stat(path)
    path.write_text(policy_text("z.example.com"))  # same length as the original
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    found = False
    for _ in range(5):  # rehash_every=5: found within five polls even though stat looks unchanged
        found = found or await watcher.poll()
    assert found and allows(store, "z.example.com")


async def test_watch_loop_and_stale_connection_closing(tmp_path: Path) -> None:
    """A connection admitted under generation N is closed when N+1 arrives (control closes, spec §3.15)."""
    path, store, _ = setup(tmp_path)
    closed: list[int] = []
    done = trio.Event()
    seen: list[PolicySnapshot] = []
    store.subscribe(seen.append)

    async def connection() -> None:
        admitted = store.generation
        snap = await store.wait_for_change(admitted)
        closed.append(snap.generation)
        done.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(watch_policy_file, path, store, interval=0.02))
            nursery.start_soon(connection)
            await trio.sleep(0.1)
            assert closed == []
            replace(path, policy_text("a.example.com", "d.example.com"))
            await done.wait()
            nursery.cancel_scope.cancel()
    assert closed == [1] and [s.generation for s in seen] == [1]
    assert allows(store, "d.example.com")


async def test_large_policy_reload_does_not_block_the_loop(tmp_path: Path) -> None:
    path, store, watcher = setup(tmp_path)
    await watcher.poll()
    replace(path, policy_text(*(f"h{i}.example.com" for i in range(10000))))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.005)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        assert await watcher.poll()
        nursery.cancel_scope.cancel()
    assert store.generation == 1 and allows(store, "h9999.example.com")
    print(f"ticks during a 10000-endpoint reload: {ticks}")
    assert ticks > 5  # the event loop kept running while the candidate was parsed and compiled
