"""The boundary reads an ``execve``'s environment from the caller's memory (identity.py ``_envp_loader_env``)
while the caller waits: the pointer array and the strings' heads in few reads. Checked here against this test's
own memory (``/proc/self/mem``): the batched reading finds what a reading entry by entry finds, wherever the
strings lie, and memory it cannot read still counts as ``LD_PRELOAD``."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.boundary.capture import identity
from supervisor.boundary.capture.identity import IdentityResolver

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)


@pytest.fixture(scope="module")
def resolver() -> IdentityResolver:
    return IdentityResolver(anchor_pid=os.getpid(), workload_pids=set, agent_pid=lambda: None)


class Env:
    """An ``envp`` array in this process's memory: each string its own buffer, ``gaps[i]`` bytes of other memory
    before string ``i`` (so strings lie close together or far apart)."""

    def __init__(self, entries: list[bytes], gaps: list[int]) -> None:
        self.keep: list[object] = []
        pointers = []
        for entry, gap in zip(entries, gaps, strict=True):
            if gap:
                self.keep.append(ctypes.create_string_buffer(gap))
            buffer = ctypes.create_string_buffer(entry)
            self.keep.append(buffer)
            pointers.append(ctypes.addressof(buffer))
        self.array = (ctypes.c_void_p * (len(pointers) + 1))(*pointers, None)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def expected(entries: list[bytes]) -> tuple[str, ...]:
    names = {entry.partition(b"=")[0] for entry in entries if entry.partition(b"=")[2].strip()}
    return tuple(sorted(name.decode() for name in names & {b"LD_PRELOAD", b"LD_AUDIT"}))


ENTRY = st.one_of(
    st.sampled_from([b"LD_PRELOAD=/tmp/x.so", b"LD_AUDIT=a.so", b"LD_PRELOAD=", b"LD_AUDIT= ", b"LD_BIND_NOW=1"]),
    st.binary(min_size=0, max_size=40).map(lambda raw: raw.replace(b"\0", b"")),
    st.sampled_from([b"PATH=/usr/bin", b"L", b"LD", b"LD_", b"HOME=/root"]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ENTRY, st.sampled_from([0, 0, 7, 600, 70_000])), max_size=80))
def test_the_batched_reading_finds_what_reading_entry_by_entry_finds(
    resolver: IdentityResolver, drawn: list[tuple[bytes, int]]
) -> None:
    entries = [entry for entry, _ in drawn]
    env = Env(entries, [gap for _, gap in drawn])
    assert resolver._envp_loader_env(os.getpid(), env.address) == expected(entries)


def test_every_pointer_comes_back_in_array_order() -> None:
    env = Env([b"B=1", b"LD_PRELOAD=x", b"A=2", b"LD_PRELOAD=x"], [70_000, 0, 600, 0])
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        pointers = identity._env_pointers(fd, env.address)
        assert pointers == list(env.array)[:-1]
        assert identity._loader_candidates(fd, pointers) == [pointers[1], pointers[3]]
    finally:
        os.close(fd)


@pytest.fixture
def edge() -> Iterator[int]:
    """The address of the last page of a mapping whose next page is unmapped."""
    region = mmap.mmap(-1, 2 * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert libc.munmap(base + PAGE, PAGE) == 0
    yield base
    del region  # munmap of the whole range (its second half is gone already)


def test_an_unreadable_string_counts_as_ld_preload(resolver: IdentityResolver, edge: int) -> None:
    good = ctypes.create_string_buffer(b"PATH=/usr/bin")
    array = (ctypes.c_void_p * 3)(ctypes.addressof(good), edge + PAGE + 16, None)
    assert resolver._envp_loader_env(os.getpid(), ctypes.addressof(array)) == ("LD_PRELOAD",)
    ctypes.memmove(edge + PAGE - 16, b"PATH=/usr/bin\0", 14)  # close enough to share one read with the next
    near = (ctypes.c_void_p * 3)(edge + PAGE - 16, edge + PAGE + 16, None)
    assert resolver._envp_loader_env(os.getpid(), ctypes.addressof(near)) == ("LD_PRELOAD",)


def test_an_array_running_off_its_mapping_counts_as_ld_preload(resolver: IdentityResolver, edge: int) -> None:
    good = ctypes.create_string_buffer(b"PATH=/usr/bin")
    slots = (ctypes.c_void_p * 4).from_address(edge + PAGE - 4 * 8)
    slots[:] = [ctypes.addressof(good)] * 4  # no NULL before the mapping ends
    assert resolver._envp_loader_env(os.getpid(), edge + PAGE - 4 * 8) == ("LD_PRELOAD",)
    slots[3] = None  # ends just before the edge: read across it, the array is whole
    assert resolver._envp_loader_env(os.getpid(), edge + PAGE - 4 * 8) == ()


def test_a_short_string_at_the_end_of_a_mapping_is_read(resolver: IdentityResolver, edge: int) -> None:
    ctypes.memmove(edge + PAGE - 2, b"L\0", 2)  # "L" and its NUL are the mapping's last two bytes
    alone = (ctypes.c_void_p * 2)(edge + PAGE - 2, None)
    assert resolver._envp_loader_env(os.getpid(), ctypes.addressof(alone)) == ()
    other = ctypes.create_string_buffer(b"LD_AUDIT=a.so")
    array = (ctypes.c_void_p * 3)(ctypes.addressof(other), edge + PAGE - 2, None)  # one span across both
    assert resolver._envp_loader_env(os.getpid(), ctypes.addressof(array)) == ("LD_AUDIT",)
