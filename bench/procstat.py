"""Reading a contender's memory and descriptors from /proc (Linux only).

Peak RSS is the kernel's own high-water mark (``VmHWM``). Writing ``5`` to ``/proc/PID/clear_refs``
resets that mark to the current RSS (Linux ≥ 4.0), so the harness can measure the peak of one scenario
in a process that already ran others. Where the reset is refused (not our process, no root), the
caller falls back to sampling ``VmRSS``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def process_tree(root: int) -> list[int]:
    """``root`` and all its live descendants (threads are not processes and are not listed)."""
    seen: list[int] = []
    pending = [root]
    while pending:
        pid = pending.pop()
        if pid in seen or not (PROC / str(pid)).exists():
            continue
        seen.append(pid)
        pending.extend(_children(pid))
    return seen


def _children(pid: int) -> list[int]:
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in (PROC / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError):
                children.extend(int(c) for c in (task / "children").read_text().split())
    return children


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None.

    A pid plus its start time names one process for good: pids are reused, this pair never is.
    """
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after its last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19])


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time the processes have used so far, threads included (fields 14-15 of
    /proc/PID/stat); a process that is gone counts 0."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (PROC / str(pid) / "stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def parse_status_kib(text: str, field: str) -> int | None:
    """The value in KiB of a ``Field:   1234 kB`` line of /proc/PID/status."""
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


@dataclass(frozen=True)
class Memory:
    rss_kib: int
    hwm_kib: int


def memory(pids: list[int]) -> Memory:
    """Summed current and peak RSS of ``pids`` (shared pages count once per process)."""
    rss = hwm = 0
    for pid in pids:
        try:
            text = (PROC / str(pid) / "status").read_text()
        except OSError:
            continue
        rss += parse_status_kib(text, "VmRSS") or 0
        hwm += parse_status_kib(text, "VmHWM") or 0
    return Memory(rss, hwm)


def reset_peak(pids: list[int]) -> bool:
    """Reset every process's VmHWM to its current RSS; False if any reset was refused."""
    ok = True
    for pid in pids:
        try:
            (PROC / str(pid) / "clear_refs").write_text("5")
        except OSError:
            ok = False
    return ok


def open_fds(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += len(os.listdir(PROC / str(pid) / "fd"))
    return total


@dataclass(frozen=True)
class BoundSocket:
    protocol: str  # "tcp", "tcp6", "udp", "udp6"
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    listening: bool


def parse_proc_net_address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:1F90`` → (127.0.0.1, 8080): /proc/net prints each 32-bit word in host (little) order."""
    address_hex, port_hex = text.split(":")
    raw = bytes.fromhex(address_hex)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.IPv4Address(words) if len(words) == 4 else ipaddress.IPv6Address(words)
    return address, int(port_hex, 16)


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes: set[int] = set()
    for pid in pids:
        fd_dir = PROC / str(pid) / "fd"
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(int(target[8:-1]))
    return inodes


TCP_LISTEN = "0A"


def bound_sockets(pids: list[int]) -> list[BoundSocket]:
    """The TCP listeners and UDP sockets that ``pids`` hold (other TCP states are left out)."""
    inodes = _socket_inodes(pids)
    found: list[BoundSocket] = []
    for protocol in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(OSError):
            for line in (PROC / "net" / protocol).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) < 10 or int(fields[9]) not in inodes:
                    continue
                listening = fields[3] == TCP_LISTEN
                if protocol.startswith("tcp") and not listening:
                    continue
                address, port = parse_proc_net_address(fields[1])
                found.append(BoundSocket(protocol, address, port, listening))
    return found
