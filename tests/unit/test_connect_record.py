"""The connect-time record store and exec log (pure; issue 16)."""

from __future__ import annotations

import pytest

from supervisor.boundary.capture.connect_record import ConnectRecords, ExecLog, FirstExecs
from supervisor.protocol.identity import ConnectionIdentity


def who(path: str) -> ConnectionIdentity:
    return ConnectionIdentity(path, None, (), (), pid=7, start_time=1, uid=1000, owners=1, resolved_in_us=5)


PYTHON, CURL = who("/usr/bin/python3"), who("/usr/bin/curl")


def test_a_record_is_taken_once_and_only_with_its_cookie() -> None:
    records = ConnectRecords()
    assert records.put(10, 111, PYTHON)
    assert records.take(10, 222) is None  # another socket that reused the inode
    assert records.take(10, 111) == PYTHON
    assert records.take(10, 111) is None  # consumed
    assert records.put(11, 5, CURL)
    assert records.take(11, None) == CURL  # no cookie at accept: the inode decides


def test_the_first_record_of_a_socket_wins() -> None:
    records = ConnectRecords()
    assert records.put(10, 111, PYTHON)
    assert not records.put(10, 111, CURL)
    assert records.take(10, 111) == PYTHON
    assert records.put(10, 111, CURL)  # once taken, the inode is free again


def test_records_expire_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("supervisor.boundary.capture.connect_record.time.monotonic", lambda: now[0])
    records = ConnectRecords(ttl=10, limit=3)
    records.put(1, 1, who("/a"))
    now[0] += 11
    records.put(2, 2, who("/b"))
    assert records.take(1, 1) is None and len(records) == 1
    for inode in (3, 4, 5):
        records.put(inode, inode, who(f"/{inode}"))
    assert len(records) == 3 and records.take(2, 2) is None  # the oldest went first


def test_the_exec_log_keeps_the_image_at_creation() -> None:
    log = ExecLog(limit=2)
    log.note_child(7, 100, "/usr/bin/python3.11")
    log.note_child(7, 100, "/usr/bin/dash")  # the parent's second exec: the child was made before the first
    assert log.parent_exe(7, 100) == "/usr/bin/python3.11"
    assert log.parent_exe(7, 101) is None  # a recycled pid is another process
    log.note_child(8, 1, "a")
    log.note_child(9, 1, "b")
    assert log.parent_exe(7, 100) is None and len(log) == 2


def test_loader_variables_only_accumulate() -> None:
    log = ExecLog()
    assert log.loader(7, 100) is None  # never exec'd under the filter
    log.note_loader(7, 100, ())
    assert log.loader(7, 100) == ()
    log.note_loader(7, 100, ("LD_PRELOAD",))
    log.note_loader(7, 100, ())  # a later (perhaps failed) exec with a clean environment clears nothing
    assert log.loader(7, 100) == ("LD_PRELOAD",)
    log.note_loader(7, 100, ("LD_AUDIT",))
    assert log.loader(7, 100) == ("LD_AUDIT", "LD_PRELOAD")


def test_first_execs_vouch_once_per_window_for_a_child_of_its_exec_init_and_never_under_loader_variables() -> None:
    first = FirstExecs()
    assert first.vouches_for({"PATH": "/usr/bin", "LD_BIND_NOW": "1"})
    for name in ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH"):
        assert not first.vouches_for({"PATH": "/usr/bin", name: ""}), name  # even empty: read it as usual
    assert not first.take(100)  # no window
    first.open(100)
    assert not first.take(200)  # a child of another process
    assert first.take(100)  # the launch's child
    assert not first.take(100)  # spent: the next one (another candidate, a re-exec, an orphan) is read
    first.open(100)
    first.close(100)
    assert not first.take(100)  # the launch is over
