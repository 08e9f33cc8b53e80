"""``cp`` from the attacker's side: the archive out of the workload is whatever the agent makes its ``tar`` write
(it can ptrace it, or be it), so each test hands the host-side extractor an archive crafted to escape the
destination and asserts both that the member was refused and that nothing changed outside it — a file next to
the destination (``outside``) keeps its bytes, no new entry appears anywhere but below the destination. And the
other way: a source tree with links and special files, read by the packer, sends none of them.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.cli.copy_archive import ArchiveError, ArchiveReader, Data, Member, MemberEnd, member_header
from supervisor.cli.copy_extract import CopyLimit, Extractor, Limits, open_directory
from supervisor.cli.copy_pack import Packer

SECRET = b"the host's own bytes\n"


def archive(*members: tuple[tarfile.TarInfo, bytes], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            info.size = len(data) if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def entry(name: str, kind: bytes = tarfile.REGTYPE, *, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


class World:
    """A destination directory ``dest`` next to ``outside`` (a file and a directory the agent must not reach)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.dest = tmp / "dest"
        self.dest.mkdir()
        self.outside = tmp / "outside"
        self.outside.mkdir()
        (self.outside / "secret").write_bytes(SECRET)
        self.before = tree(tmp)

    def extract(self, data: bytes, *, limits: Limits | None = None, chunk: int = 700) -> Extractor:
        fd = open_directory(str(self.dest))
        extractor = Extractor(fd, ("tree", "tree"), limits or Limits())
        try:
            for at in range(0, len(data), chunk):  # any split of the stream reads the same
                extractor.feed(data[at : at + chunk])
            extractor.finish()
        finally:
            extractor.abort()
            os.close(fd)
        return extractor

    def unchanged_outside(self) -> None:
        assert (self.outside / "secret").read_bytes() == SECRET
        assert sorted(os.listdir(self.outside)) == ["secret"]
        new = {p for p in tree(self.tmp) - self.before if not p.startswith("dest/")}
        assert not new, f"written outside the destination: {new}"
        leftovers = [p for p in tree(self.dest) if ".osb-cp-" in p]
        assert not leftovers, leftovers


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_a_plain_tree_arrives(world: World) -> None:
    got = world.extract(archive((entry("tree", tarfile.DIRTYPE, mode=0o755), b""), (entry("tree/a"), b"one\n"),
                                (entry("tree/sub/b"), b"x" * 5000)))  # fmt: skip
    assert got.refused == [] and (got.files, got.directories) == (2, 1)
    assert (world.dest / "tree" / "a").read_bytes() == b"one\n"
    assert (world.dest / "tree" / "sub" / "b").read_bytes() == b"x" * 5000
    world.unchanged_outside()


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_names_in_either_format(world: World, fmt: int) -> None:
    name = "tree/" + "d" * 150 + "/" + "f" * 200
    got = world.extract(archive((entry(name), b"long\n"), fmt=fmt))
    assert got.refused == []
    assert (world.dest / name).read_bytes() == b"long\n"


@pytest.mark.parametrize("name", ["tree/../../outside/secret", "tree/../escape", "../outside/secret", "tree/a/../.."])
def test_dot_dot_is_refused(world: World, name: str) -> None:
    got = world.extract(archive((entry(name), b"overwritten\n")))
    assert got.refused and "'..'" in got.refused[0]
    world.unchanged_outside()
    assert tree(world.dest) == set()


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_absolute_names_are_refused(world: World, fmt: int) -> None:
    target = str(world.outside / "secret")
    got = world.extract(archive((entry(target), b"overwritten\n"), (entry("/tmp/x-osb-cp"), b"y"), fmt=fmt))
    assert len(got.refused) == 2 and all("absolute" in line for line in got.refused)
    world.unchanged_outside()
    assert not Path("/tmp/x-osb-cp").exists()


def test_a_symlink_then_a_file_through_it(world: World) -> None:
    got = world.extract(archive(
        (entry("tree", tarfile.DIRTYPE), b""),
        (entry("tree/link", tarfile.SYMTYPE, link=str(world.outside)), b""),
        (entry("tree/link/secret"), b"overwritten\n"),
    ))  # fmt: skip
    assert any("symbolic link" in line for line in got.refused)
    world.unchanged_outside()
    assert not (world.dest / "tree" / "link").is_symlink()


def test_an_existing_symlink_in_the_destination_is_never_followed(world: World) -> None:
    (world.dest / "tree").mkdir()
    (world.dest / "tree" / "evil").symlink_to(world.outside)
    (world.dest / "tree" / "file-link").symlink_to(world.outside / "secret")
    world.before = tree(world.tmp)
    got = world.extract(archive(
        (entry("tree/evil/secret"), b"through a directory link\n"),
        (entry("tree/evil/new"), b"a new file through it\n"),
        (entry("tree/file-link"), b"in place of the link\n"),
    ))  # fmt: skip
    assert sum("symbolic link" in line for line in got.refused) == 2, got.refused
    world.unchanged_outside()
    # the member named like the file link replaces the link itself, never writes through it
    assert not (world.dest / "tree" / "file-link").is_symlink()
    assert (world.dest / "tree" / "file-link").read_bytes() == b"in place of the link\n"


def test_the_destination_itself_must_not_be_a_symlink(world: World) -> None:
    link = world.tmp / "dest-link"
    link.symlink_to(world.outside)
    with pytest.raises(OSError):
        open_directory(str(link))


def test_a_hard_link_is_refused(world: World) -> None:
    got = world.extract(archive((entry("tree/h", tarfile.LNKTYPE, link=str(world.outside / "secret")), b"")))
    assert got.refused == ["tree/h: refused, a hard link"]
    world.unchanged_outside()
    assert tree(world.dest) == set()
    assert os.stat(world.outside / "secret").st_nlink == 1


@pytest.mark.parametrize(("kind", "what"), [(tarfile.CHRTYPE, "character device"), (tarfile.BLKTYPE, "block device"),
                                            (tarfile.FIFOTYPE, "FIFO")])  # fmt: skip
def test_device_nodes_and_fifos_are_refused(world: World, kind: bytes, what: str) -> None:
    info = entry("tree/node", kind, mode=0o666)
    info.devmajor, info.devminor = 1, 3  # /dev/null's numbers (or the disk's: refused all the same)
    got = world.extract(archive((info, b"")))
    assert got.refused == [f"tree/node: refused, a {what}"]
    assert tree(world.dest) == set()
    world.unchanged_outside()


def test_set_id_bits_are_dropped_and_the_owner_is_ours(world: World) -> None:
    info = entry("tree/suid", mode=0o6777)
    info.uid, info.gid, info.uname, info.gname = 0, 0, "root", "root"
    shell = entry("tree/dir", tarfile.DIRTYPE, mode=0o3777)
    shell.uid = 4242
    got = world.extract(archive((info, b"#!/bin/sh\n"), (shell, b""), (entry("tree/dir/x"), b"x")))
    assert got.refused == []
    made = os.stat(world.dest / "tree" / "suid")
    assert made.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) == 0
    assert (made.st_uid, made.st_gid) == (os.geteuid(), os.getegid())
    directory = os.stat(world.dest / "tree" / "dir")
    assert directory.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) == 0
    assert directory.st_uid == os.geteuid()


def test_only_the_path_asked_for(world: World) -> None:
    got = world.extract(archive((entry("other/file"), b"x"), (entry("tree/ok"), b"ok")))
    assert got.refused == ["other/file: refused, outside the path asked for"]
    assert tree(world.dest) == {"tree", "tree/ok"}


def _endless() -> Iterator[bytes]:
    """A regular member declaring a terabyte (a sparse file read by tar), then zeros for ever."""
    yield member_header("tree/big", directory=False, mode=0o644, size=1 << 40, mtime=0)
    while True:
        yield bytes(1 << 20)


def test_an_endless_stream_stops_at_the_byte_bound_and_leaves_nothing(world: World) -> None:
    fd = open_directory(str(world.dest))
    extractor = Extractor(fd, ("tree", "tree"), Limits(max_bytes=8 << 20))
    try:
        with pytest.raises(CopyLimit, match="larger than 8388608 bytes"):
            for chunk in _endless():
                extractor.feed(chunk)
    finally:
        extractor.abort()
        os.close(fd)
    assert extractor.received <= (8 << 20) + (1 << 20)
    assert tree(world.dest) == {"tree"}  # the unfinished file is removed
    world.unchanged_outside()


def test_too_many_members_stops(world: World) -> None:
    members = [(entry(f"tree/{i}"), b"") for i in range(20)]
    with pytest.raises(CopyLimit, match="more than 10 members"):
        world.extract(archive(*members), limits=Limits(max_members=10))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:700], "ended early"),
        (lambda data: data[:148] + b"99999999" + data[156:], "malformed header"),
    ],
)
def test_a_damaged_archive_is_an_error(world: World, damage: object, message: str) -> None:
    data = archive((entry("tree/a"), b"x" * 1000))
    with pytest.raises(ArchiveError, match=message):
        world.extract(damage(data))  # type: ignore[operator]


def test_a_huge_extended_header_is_refused_before_it_is_read() -> None:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, 1 << 40
    with pytest.raises(ArchiveError, match="extended header"):
        ArchiveReader().feed(info.tobuf(tarfile.GNU_FORMAT))


def test_events_do_not_depend_on_the_split() -> None:
    data = archive((entry("tree/a"), b"a" * 1500), (entry("tree/b", tarfile.SYMTYPE, link="/"), b""))
    whole = ArchiveReader().feed(data)
    reader = ArchiveReader()
    split = [event for byte in range(len(data)) for event in reader.feed(data[byte : byte + 1])]
    joined: list[object] = []
    for event in split:
        if isinstance(event, Data) and joined and isinstance(joined[-1], Data):
            joined[-1] = Data(joined[-1].data + event.data)
        else:
            joined.append(event)
    assert joined == whole
    assert [type(e) for e in whole] == [Member, Data, MemberEnd, Member, MemberEnd]


# -- the other way: what the packer reads from a source the agent may be changing ------------------------------


def _members(chunks: Iterator[bytes]) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
        return {info.name: info for info in tar.getmembers()}


def test_the_packer_sends_only_files_and_directories(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("f\n")
    (src / "suid").write_text("s\n")
    os.chmod(src / "suid", 0o6755)
    secret = tmp_path / "host-secret"
    secret.write_bytes(SECRET)
    (src / "to-secret").symlink_to(secret)
    (src / "to-dir").symlink_to(tmp_path)
    os.mkfifo(src / "fifo")  # opening it would block: it must never be opened
    os.link(src / "d" / "f", src / "hard")
    packer = Packer()
    fd = open_directory(str(tmp_path))
    try:
        members = _members(packer.stream(fd, "src", "top"))
    finally:
        os.close(fd)
    assert set(members) == {"top", "top/d", "top/d/f", "top/hard", "top/suid"}
    assert all(info.type in (tarfile.REGTYPE, tarfile.DIRTYPE) for info in members.values())
    assert members["top/suid"].mode == 0o755 and members["top/suid"].uid == 0
    assert sorted(packer.refused) == ["top/fifo: refused, a FIFO", "top/to-dir: refused, a symbolic link",
                                      "top/to-secret: refused, a symbolic link"]  # fmt: skip


def test_the_packer_refuses_a_symlinked_source(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "src").symlink_to(tmp_path / "secret")
    packer = Packer()
    fd = open_directory(str(tmp_path))
    try:
        members = _members(packer.stream(fd, "src", "top"))
    finally:
        os.close(fd)
    assert members == {} and packer.refused == ["top: refused, a symbolic link"]


def test_the_packer_stops_at_its_byte_bound(tmp_path: Path) -> None:
    with open(tmp_path / "big", "wb") as out:
        out.truncate(1 << 40)  # sparse: a terabyte the packer would read for ever
    fd = open_directory(str(tmp_path))
    try:
        with pytest.raises(CopyLimit, match="larger than"):
            for _ in Packer(Limits(max_bytes=4 << 20)).stream(fd, "big", "big"):
                pass
    finally:
        os.close(fd)


def test_a_file_swapped_between_look_and_open_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent swaps a checked file for another one between the packer's look and its open."""
    (tmp_path / "f").write_text("checked\n")
    (tmp_path / "other").write_bytes(SECRET)
    real_open = os.open

    def swapping_open(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "f":
            os.replace(tmp_path / "other", tmp_path / "f")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", swapping_open)
    packer = Packer()
    fd = real_open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        members = _members(packer.stream(fd, "f", "f"))
    finally:
        os.close(fd)
    assert members == {} and packer.refused == ["f: refused, it changed while it was read"]
