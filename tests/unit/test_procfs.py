"""``procfs.read``: the whole file, however the kernel hands it over, and ``open``'s errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.boundary import procfs


def test_reads_a_file_larger_than_one_read_to_its_end(tmp_path: Path) -> None:
    data = os.urandom(3 * 65536 + 17)
    (tmp_path / "big").write_bytes(data)
    assert procfs.read(str(tmp_path / "big")) == data


def test_reads_an_empty_file_and_a_proc_entry_as_open_would(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert procfs.read(str(tmp_path / "empty")) == b""
    with open(f"/proc/{os.getpid()}/status", "rb") as handle:
        expected = handle.read().split(b"\nVmPeak")[0]  # the lines before the memory counters do not move
    assert procfs.read(f"/proc/{os.getpid()}/status").split(b"\nVmPeak")[0] == expected


def test_a_process_that_is_gone_is_file_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        procfs.read("/proc/0/stat")
