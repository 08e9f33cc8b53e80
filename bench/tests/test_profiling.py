"""Top costs from py-spy's collapsed stacks."""

from __future__ import annotations

from bench.profiling import format_top, parse_collapsed

COLLAPSED = """\
main (a.py:1);relay (a.py:5);send (a.py:9) 60
main (a.py:1);relay (a.py:5);recv (a.py:7) 30
main (a.py:1);idle (a.py:3) 10
garbage line
"""


def test_self_and_total_costs() -> None:
    top = parse_collapsed(COLLAPSED)
    assert top.samples == 100
    assert top.self_cost == [("send (a.py:9)", 60), ("recv (a.py:7)", 30), ("idle (a.py:3)", 10)]
    assert dict(top.total_cost)["main (a.py:1)"] == 100
    assert dict(top.total_cost)["relay (a.py:5)"] == 90


def test_recursion_counts_once_in_total() -> None:
    top = parse_collapsed("f (x:1);f (x:1);f (x:1) 7\n")
    assert top.total_cost == [("f (x:1)", 7)]


def test_format_names_the_top_cost_first() -> None:
    text = format_top(parse_collapsed(COLLAPSED), "demo")
    lines = text.splitlines()
    assert lines[0] == "demo: 100 samples running (100 in all, 0 waiting left out)"
    assert lines[2].endswith("send (a.py:9)") and "60.0%" in lines[2]


def test_idle_waits_are_counted_apart_and_left_out_of_the_ranking() -> None:
    text = COLLAPSED + (
        "_bootstrap (threading.py:1002);WorkerThread._work (trio/_core/_thread_cache.py:211) 300\n"
        "main (a.py:1);run (trio/_core/_run.py:2532);EpollIOManager.get_events (trio/_core/_io_epoll.py:243) 50\n"
    )
    top = parse_collapsed(text)
    assert (top.samples, top.waiting, top.active) == (450, 350, 100)
    assert top.self_cost[0] == ("send (a.py:9)", 60)
    assert all("_thread_cache" not in frame for frame, _ in top.total_cost)
    assert "60.0%" in format_top(top, "demo").splitlines()[2]
