"""/proc readers: process trees, start times, memory, bound sockets."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time

import pytest

from bench.procstat import (
    bound_sockets,
    cpu_seconds,
    memory,
    parse_proc_net_address,
    parse_status_kib,
    process_tree,
    reset_peak,
    start_time,
)


def test_cpu_seconds_counts_a_busy_child_and_nothing_for_the_gone() -> None:
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ninput()"
    busy = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while cpu_seconds([busy.pid]) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu_seconds([busy.pid]) >= 0.25
    finally:
        busy.communicate(b"\n", timeout=30)
    assert cpu_seconds([busy.pid]) == 0.0  # reaped: nothing to count
    assert cpu_seconds([]) == 0.0


STATUS = "Name:\tx\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\n"


@pytest.mark.parametrize(("field", "expected"), [("VmRSS", 1024), ("VmHWM", 2048), ("VmSwap", None)])
def test_parse_status_kib(field: str, expected: int | None) -> None:
    assert parse_status_kib(STATUS, field) == expected


@pytest.mark.parametrize(
    ("text", "address", "port"),
    [
        ("0100007F:1F90", "127.0.0.1", 8080),
        ("00000000:0050", "0.0.0.0", 80),
        ("00000000000000000000000001000000:01BB", "::1", 443),
        ("0000000000000000FFFF00000100007F:0035", "::ffff:127.0.0.1", 53),
    ],
)
def test_parse_proc_net_address(text: str, address: str, port: int) -> None:
    assert parse_proc_net_address(text) == (ipaddress.ip_address(address), port)


def test_start_time_names_a_live_process_only() -> None:
    assert start_time(os.getpid()) is not None
    assert start_time(2**22 + 12345) is None  # above any pid_max


def test_process_tree_finds_children_and_memory_counts_them() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
        assert memory([child.pid]).rss_kib > 0
        assert memory(tree).rss_kib > memory([os.getpid()]).rss_kib
    finally:
        child.kill()
        child.wait()
    assert child.pid not in process_tree(os.getpid())


def test_reset_peak_refused_for_a_missing_process() -> None:
    assert reset_peak([2**22 + 12345]) is False


def test_reset_peak_lowers_the_high_water_mark() -> None:
    code = (
        "import sys\nblob = bytearray(64 << 20)\nfor i in range(0, len(blob), 4096): blob[i] = 1\n"
        "del blob\nprint('ready', flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        before = memory([child.pid])
        assert before.hwm_kib > before.rss_kib + 32 * 1024
        if not reset_peak([child.pid]):
            pytest.skip("clear_refs refused here (not root?)")
        after = memory([child.pid])
        assert after.hwm_kib < before.hwm_kib - 32 * 1024
    finally:
        child.kill()
        child.wait()


def test_bound_sockets_sees_listeners_and_udp_but_not_connections() -> None:
    with socket.socket() as listener, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        udp.bind(("127.0.0.1", 0))
        with socket.create_connection(listener.getsockname()) as client:
            found = {(s.protocol, str(s.address), s.port) for s in bound_sockets([os.getpid()])}
            client_port = client.getsockname()[1]
        tcp_port, udp_port = listener.getsockname()[1], udp.getsockname()[1]
    assert ("tcp", "127.0.0.1", tcp_port) in found
    assert ("udp", "127.0.0.1", udp_port) in found
    assert not any(port == client_port for protocol, _, port in found if protocol == "tcp")
