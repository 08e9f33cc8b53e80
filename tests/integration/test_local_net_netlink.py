"""Control's reading of its namespace follows netlink changes, in a network namespace this test makes.

A child process in a fresh namespace runs ``LocalNetwork.watch`` with the periodic re-read pushed out to an hour,
so only the netlink wake-up can make it see what the test then changes from outside: an address added to an
interface becomes control-local, and a default IPv6 route turns IPv6 egress on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns_hosts import require_netns

CHILD = r"""
import ipaddress, sys, trio
import supervisor.control.local_net as local_net

local_net.REREAD_S = 3600.0  # only a netlink wake-up can bring a re-read within this test


async def until(check):
    with trio.fail_after(30):
        while not check():
            await trio.sleep(0.02)


async def main():
    net = local_net.LocalNetwork()
    target = ipaddress.ip_address(sys.argv[1])
    async with trio.open_nursery() as nursery:
        await nursery.start(net.watch)
        print("ready", net.is_local(target), net.ipv6_egress, flush=True)
        await until(lambda: net.is_local(target))
        print("address-seen", flush=True)
        await until(lambda: net.ipv6_egress)
        print("ipv6-seen", flush=True)
        nursery.cancel_scope.cancel()


trio.run(main)
"""

ADDRESS = "192.0.2.77"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[str]:
    require_netns()
    name = f"osbt-ln-{os.getpid()}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", "d0", "type", "veth", "peer", "name", "d1")  # no dummy module here
        _ip("-n", name, "link", "set", "d0", "up")
        _ip("-n", name, "link", "set", "d1", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, f"the watcher ended: {proc.stderr.read() if proc.stderr else ''}"
    return line


def test_address_and_route_changes_are_seen_through_netlink(netns: str, tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, str(script), ADDRESS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        assert _line(proc) == "ready False False"  # a fresh namespace: not ours yet, no IPv6 route
        _ip("-n", netns, "addr", "add", f"{ADDRESS}/32", "dev", "d0")
        assert _line(proc) == "address-seen"
        _ip("-n", netns, "-6", "route", "add", "default", "dev", "d0")
        assert _line(proc) == "ipv6-seen"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
