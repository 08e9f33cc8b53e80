"""Sampling profiles of a contender's processes with py-spy, by pid, and their top costs.

py-spy writes "raw" (collapsed) stacks: one ``frame;frame;...;leaf COUNT`` line per distinct stack,
root first. A function's *self* cost is the samples where it is the leaf; its *total* cost is the
samples whose stack contains it at least once. Only Python processes can be profiled; for the others
py-spy fails and the reason is returned instead of a profile.

py-spy's own idle detection misses threads parked in a lock wait with a timeout (trio's idle worker
threads) and an event loop blocked in ``epoll_wait``: samples whose leaf is one of :data:`IDLE_LEAVES`
are counted apart as *waiting* and left out of the top lists, which then rank what used the CPU.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_RATE = 200
STOP_TIMEOUT = 20.0
# Leaf frames that mean "blocked in a C call, waiting": (function, file) as py-spy prints them, any line.
IDLE_LEAVES = (
    ("WorkerThread._work", "trio/_core/_thread_cache.py"),  # an idle worker thread waiting for a job
    ("EpollIOManager.get_events", "trio/_core/_io_epoll.py"),  # trio's loop in epoll_wait
    ("BaseSelector.select", "selectors.py"),
    ("EpollSelector.select", "selectors.py"),
    ("Condition.wait", "threading.py"),
    ("Event.wait", "threading.py"),
    ("Thread._wait_for_tstate_lock", "threading.py"),
)


@dataclass(frozen=True)
class TopCosts:
    samples: int  # every sample, waiting ones included
    self_cost: list[tuple[str, int]]  # most samples as the leaf first (waiting samples left out)
    total_cost: list[tuple[str, int]]  # most samples anywhere on the stack first (waiting samples left out)
    waiting: int = 0  # samples whose leaf was an idle wait

    @property
    def active(self) -> int:
        return self.samples - self.waiting


def is_waiting(frame: str) -> bool:
    """``frame`` is ``function (file:line)``: is it one of the idle waits?"""
    function, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    return any(function == f and path.endswith(p) for f, p in IDLE_LEAVES)


def parse_collapsed(text: str, top: int = 15) -> TopCosts:
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = waiting = 0
    for line in text.splitlines():
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        if is_waiting(frames[-1]):
            waiting += count
            continue
        self_counts[frames[-1]] += count
        for frame in set(frames):
            total_counts[frame] += count
    return TopCosts(samples, self_counts.most_common(top), total_counts.most_common(top), waiting)


def format_top(costs: TopCosts, title: str) -> str:
    def percent(count: int) -> str:
        return f"{100 * count / max(costs.active, 1):5.1f}%"

    lines = [
        f"{title}: {costs.active} samples running ({costs.samples} in all, {costs.waiting} waiting left out)",
        "  top self time (the function itself was running):",
    ]
    lines += [f"    {percent(count)}  {frame}" for frame, count in costs.self_cost]
    lines.append("  top total time (the function was on the stack):")
    lines += [f"    {percent(count)}  {frame}" for frame, count in costs.total_cost]
    return "\n".join(lines)


@dataclass
class Recording:
    """py-spy recorders attached to every pid of one contender for one scenario."""

    py_spy: Path
    pids: list[int]
    prefix: Path  # output files are ``<prefix>.<pid>.txt``
    procs: list[tuple[int, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self) -> None:
        for pid in self.pids:
            argv = [
                str(self.py_spy),
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                str(SAMPLE_RATE),
                "--output",
                str(self.output(pid)),
            ]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.procs.append((pid, proc))
        time.sleep(1.0)  # py-spy needs a moment to attach before the scenario starts

    def output(self, pid: int) -> Path:
        return self.prefix.with_name(f"{self.prefix.name}.{pid}.txt")

    def stop(self) -> dict[int, str]:
        """Stop every recorder; return {pid: error} for those that produced no profile."""
        errors: dict[int, str] = {}
        for pid, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                _, err = proc.communicate(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if not self.output(pid).exists():
                text = err.decode(errors="replace").strip().splitlines()
                errors[pid] = text[0] if text else f"py-spy exited {proc.returncode}"
        self.procs.clear()
        return errors

    def summary(self) -> TopCosts:
        text = "\n".join(self.output(pid).read_text(errors="replace") for pid in self.pids if self.output(pid).exists())
        return parse_collapsed(text)
