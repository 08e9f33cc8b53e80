"""The connect-time record store and exec log (pure)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.boundary.capture.connect_record import (
    PID_MAX_LIMIT,
    SWEEP_STEP,
    ConnectRecords,
    ExecLog,
    ExecLogGap,
    FirstExecs,
    _LiveTable,
    live_bound,
    proc_alive,
)
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
    log = ExecLog(limit=2, alive=lambda pid, start: pid != 7)
    log.note_child(7, 100, "/usr/bin/python3.11")
    log.note_child(7, 100, "/usr/bin/dash")  # the parent's second exec: the child was made before the first
    assert log.parent_exe(7, 100) == "/usr/bin/python3.11"
    assert log.parent_exe(7, 101) is None  # a recycled pid is another process
    log.note_child(8, 1, "a")
    log.note_child(9, 1, "b")  # full: 7 has exited, so its entry makes the room
    assert log.parent_exe(7, 100) is None and len(log) == 2
    assert (log.parent_exe(8, 1), log.parent_exe(9, 1)) == ("a", "b")


class Processes:
    """A fake process table for the exec log's liveness checks: (pid, start time) → alive, and the checks made."""

    def __init__(self) -> None:
        self.live: set[tuple[int, int]] = set()
        self.checks = 0

    def alive(self, pid: int, start_time: int) -> bool:
        self.checks += 1
        return (pid, start_time) in self.live


def test_live_entries_outlast_any_churn_of_short_lived_processes() -> None:
    """The attack that loosened the old count-bounded log: a child made before its parent's exec, then far more
    short-lived children than the log holds. The child's entry (and a preloaded process's) is still there."""
    procs = Processes()
    log = ExecLog(limit=1024, alive=procs.alive, sweep_at=64)
    procs.live |= {(50, 5), (60, 6)}
    log.note_child(50, 5, "/usr/bin/python3")  # forked before its parent exec'd curl
    log.note_loader(60, 6, ("LD_PRELOAD",))  # exec'd under LD_PRELOAD
    for n in range(100_000):  # each child lives through its own exec, then is gone
        procs.live.add((1000 + n, 7))
        log.note_child(1000 + n, 7, "/usr/bin/python3")
        log.note_loader(1000 + n, 7, ())
        procs.live.discard((1000 + n, 7))
    assert log.parent_exe(50, 5) == "/usr/bin/python3"
    assert log.loader(60, 6) == ("LD_PRELOAD",)
    assert max(log.sizes) <= 64 + 64 // 3 + 2  # the dead were swept as it went...
    assert procs.checks <= 2 * 100_000 * SWEEP_STEP  # ...a few checks per new entry, never a full pass


def test_a_full_log_refuses_rather_than_evicts_and_then_cannot_answer_for_older_processes() -> None:
    procs = Processes()
    log = ExecLog(limit=3, alive=procs.alive)
    for pid in (1, 2, 3):
        procs.live.add((pid, 10 * pid))
        log.note_child(pid, 10 * pid, "/usr/bin/python3")
        log.note_loader(pid, 10 * pid, ("LD_PRELOAD",))
    procs.live.add((4, 40))
    log.note_child(4, 40, "/usr/bin/python3")  # every entry is a live process's: refused, none evicted
    log.note_loader(4, 40, ("LD_PRELOAD",))
    assert [log.parent_exe(pid, 10 * pid) for pid in (1, 2, 3)] == ["/usr/bin/python3"] * 3
    assert [log.loader(pid, 10 * pid) for pid in (1, 2, 3)] == [("LD_PRELOAD",)] * 3
    for ask in (log.parent_exe, log.loader):
        with pytest.raises(ExecLogGap):
            ask(4, 40)  # not "its parent never exec'd" / "it never exec'd": that would be the loose answer
        with pytest.raises(ExecLogGap):
            ask(5, 35)  # nor for any other process as old: the refused entry may have been its
        assert ask(6, 41) is None  # one started after the refusal cannot have been refused
    procs.live.discard((2, 20))  # once a process is gone there is room again
    log.note_child(7, 50, "/usr/bin/dash")
    assert log.parent_exe(7, 50) == "/usr/bin/dash" and log.parent_exe(1, 10) == "/usr/bin/python3"


def test_a_process_refused_once_is_never_noted_later() -> None:
    """Its first note (the image it was created under, a preloaded exec) was lost to the full log: a later one,
    once there is room, would be taken for the first (the parent's next image, a clean exec)."""
    procs = Processes()
    log = ExecLog(limit=2, alive=procs.alive)
    procs.live |= {(1, 10), (2, 20), (3, 30)}
    for pid in (1, 2, 3):
        log.note_child(pid, 10 * pid, "/usr/bin/python3")  # 3 is refused
        log.note_loader(pid, 10 * pid, ("LD_PRELOAD",))
    procs.live.discard((1, 10))
    log.note_child(3, 30, "/usr/bin/curl")  # the parent's later exec, with room now
    log.note_loader(3, 30, ())
    for ask in (log.parent_exe, log.loader):
        with pytest.raises(ExecLogGap):
            ask(3, 30)


def test_an_unreadable_process_counts_as_alive(tmp_path: Path) -> None:
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "pid_max").write_text("32768\n")
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "stat").write_text("9 (a) b) S " + " ".join(["0"] * 18) + " 777 0 0\n")
    assert proc_alive(9, 777, str(tmp_path))
    assert not proc_alive(9, 778, str(tmp_path))  # the pid names another process now
    assert not proc_alive(10, 777, str(tmp_path))  # gone
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "stat").mkdir()  # reading fails, but not as "no such process"
    assert proc_alive(11, 1, str(tmp_path))
    assert live_bound(None, str(tmp_path)) == 32768 and live_bound(1024, str(tmp_path)) == 1024
    assert live_bound(0, str(tmp_path / "none")) == PID_MAX_LIMIT


EVENTS = st.tuples(st.sampled_from(["fork", "fork", "exec", "exec", "exit"]), st.integers(0, 7))


@settings(max_examples=150, deadline=None)
@given(st.lists(EVENTS, min_size=60, max_size=200))  # long enough to fill the log: refusals are what is tested
def test_no_sequence_of_events_evicts_a_live_entry_or_answers_loosely(events: list[tuple[str, int]]) -> None:
    """Against a model: a live process's entries are always answered as noted (or, past the cap, the log says it
    cannot answer), whatever forks, execs and exits came before; the table never exceeds its cap."""
    procs = Processes()
    log = ExecLog(limit=4, alive=procs.alive, sweep_at=2)
    noted: dict[tuple[int, int], str] = {}
    for clock, (kind, pid) in enumerate(events, 1):
        key = next((k for k in procs.live if k[0] == pid), None)
        if kind == "fork" and key is None:
            procs.live.add((pid, clock))
        elif kind == "exec" and key is not None:
            log.note_child(*key, f"/image/{clock}")
            log.note_loader(*key, ("LD_PRELOAD",))
            noted.setdefault(key, f"/image/{clock}")
        elif kind == "exit" and key is not None:
            procs.live.discard(key)
        assert max(log.sizes) <= 4
        for live in procs.live:
            loader = ("LD_PRELOAD",) if live in noted else None
            for ask, want in ((log.parent_exe, noted.get(live)), (log.loader, loader)):
                try:
                    assert ask(*live) == want
                except ExecLogGap:
                    pass  # refused at the cap: no identity, the strictest answer


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


# --- edges the mutation run asked for (docs/design.md "Testing") -------------------------------------------------


def test_a_socket_recorded_again_under_a_new_cookie_is_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    """An inode reused by a later socket: its record is the newest, so neither the bound nor the TTL drops it first."""
    now = [1000.0]
    monkeypatch.setattr("supervisor.boundary.capture.connect_record.time.monotonic", lambda: now[0])
    records = ConnectRecords(ttl=10, limit=2)
    records.put(1, 111, PYTHON)
    records.put(2, 222, CURL)
    assert records.put(1, 333, CURL)  # inode 1 again, another socket
    records.put(3, 444, PYTHON)  # over the bound: inode 2 is the oldest now
    assert records.take(2, 222) is None and records.take(1, 333) == CURL
    records.put(1, 555, CURL)
    now[0] += 6
    records.put(4, 666, PYTHON)
    records.put(1, 777, PYTHON)  # renewed after 4
    now[0] += 5  # 3 and the first 1 are past the TTL; 4 and the renewed 1 are not
    assert records.take(3, 444) is None
    assert records.take(4, 666) == PYTHON and records.take(1, 777) == PYTHON


def test_a_record_lives_exactly_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("supervisor.boundary.capture.connect_record.time.monotonic", lambda: now[0])
    records = ConnectRecords(ttl=10)
    records.put(1, 1, PYTHON)
    records.put(2, 2, CURL)
    now[0] += 10
    assert records.take(1, 1) == PYTHON
    now[0] += 0.5
    assert records.take(2, 2) is None


def test_the_real_proc_is_read_by_default() -> None:
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    started = int(stat[stat.rindex(")") + 2 :].split()[19])
    assert proc_alive(os.getpid(), started) and not proc_alive(os.getpid(), started + 1)
    assert live_bound() == int(Path("/proc/sys/kernel/pid_max").read_text())
    assert live_bound(1) == 1  # an enforced pids.max of one is a bound like any other


def test_a_stat_line_that_cannot_be_read_counts_as_alive(tmp_path: Path) -> None:
    for pid, text in ((9, "9 (a) S 1 2"), (10, "10 no parenthesis"), (11, "11 (a) S " + "x " * 30)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(text)
        assert proc_alive(pid, 1, str(tmp_path)), text


def test_the_gap_names_the_process_it_cannot_answer_for() -> None:
    procs = Processes()
    log = ExecLog(limit=1, alive=procs.alive)
    procs.live |= {(1, 10), (2, 20)}
    log.note_child(1, 10, "/a")
    log.note_child(2, 20, "/b")
    with pytest.raises(ExecLogGap, match=r"^the exec log was full when process 2 may have needed an entry$"):
        log.parent_exe(2, 20)


def test_a_table_says_what_it_kept_and_sweeps_on_its_schedule() -> None:
    """``_LiveTable.put`` (True: stored) and when sweeping starts: at ``sweep_at`` entries, and in full at the cap."""
    procs = Processes()
    table: _LiveTable[str] = _LiveTable(limit=2, alive=procs.alive, sweep_at=100)
    procs.live |= {(1, 10), (2, 20), (3, 30)}
    assert table.put((1, 10), "a") and table.put((2, 20), "b")
    assert table.put((1, 10), "c")  # an update is not a new entry
    assert not table.put((3, 30), "x")  # full of the living: refused
    assert not table.put((3, 29), "y")  # as old as the refused one: refused too, however much room
    procs.live.discard((2, 20))
    assert table.put((4, 40), "d") and list(table.entries) == [(1, 10), (4, 40)]  # the full sweep made room
    early: _LiveTable[str] = _LiveTable(limit=100, alive=lambda pid, start: False, sweep_at=2)
    for n in range(3):
        early.put((n, n), "dead")
    assert list(early.entries) == [(2, 2)]  # the third found two entries, swept them, and was stored alone


@pytest.mark.parametrize(
    ("limit", "puts", "left"), [(3, 2, 1), (7, 3, 3), (7, 4, 1), (8, 4, 4), (8, 5, 1), (200, 99, 99)]
)
def test_a_small_log_sweeps_from_half_its_cap(limit: int, puts: int, left: int) -> None:
    log = ExecLog(limit=limit, alive=lambda pid, start: False, sweep_at=99)
    for n in range(puts):
        log.note_child(n, n, "/dead")
    assert len(log) == left
