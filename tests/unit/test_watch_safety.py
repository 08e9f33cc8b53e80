"""Which policy files control may hot-reload: the rules of ``watch_safety`` on a fake tree (no filesystem)."""

from __future__ import annotations

import errno
import stat
from dataclasses import dataclass, field

import pytest

from supervisor.control.policy.watch_safety import Node, agent_writable_paths, check_watch

CONTROL = 4242
AGENT = 61000
TRUSTED = (0, CONTROL)
WRITABLE = ("/tmp", "/dev/shm", "/home/op/work")

DIR, FILE, LINK = stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK


@dataclass
class FakeFs:
    """path → (uid, st_mode); symlinks in ``links``; read-only mount points in ``ro`` (covering what is below)."""

    nodes: dict[str, tuple[int, int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    ro: set[str] = field(default_factory=set)

    def add(self, path: str, uid: int, mode: int, target: str | None = None) -> FakeFs:
        self.nodes[path] = (uid, mode)
        if target is not None:
            self.links[path] = target
        return self

    def lstat(self, path: str) -> Node:
        if path not in self.nodes:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        uid, mode = self.nodes[path]
        return Node(uid, mode)

    def readlink(self, path: str) -> str:
        return self.links[path]

    def read_only(self, path: str) -> bool:
        return any(path == m or path.startswith(m.rstrip("/") + "/") for m in self.ro)


def base() -> FakeFs:
    fs = FakeFs()
    fs.add("/", 0, DIR | 0o755).add("/etc", 0, DIR | 0o755).add("/tmp", 0, DIR | 0o1777)
    fs.add("/var", 0, DIR | 0o755).add("/var/tmp", 0, DIR | 0o1777)
    fs.add("/home", 0, DIR | 0o755).add("/home/op", CONTROL, DIR | 0o700).add("/home/op/work", AGENT, DIR | 0o755)
    return fs


def verdict(fs: FakeFs, path: str) -> tuple[bool, str]:
    v = check_watch(path, agent_writable=WRITABLE, trusted_uids=TRUSTED, fs=fs)
    return v.safe, v.reason


# (name, extra nodes, path, safe, a word the reason must contain)
CASES = [
    ("root-owned in /etc", [("/etc/p.yaml", 0, FILE | 0o644)], "/etc/p.yaml", True, "owned"),
    ("control's own file in its home", [("/home/op/p.yaml", CONTROL, FILE | 0o600)], "/home/op/p.yaml", True, ""),
    ("agent-owned file", [("/etc/p.yaml", AGENT, FILE | 0o644)], "/etc/p.yaml", False, "uid 61000"),
    ("world-writable file", [("/etc/p.yaml", 0, FILE | 0o666)], "/etc/p.yaml", False, "writable by others"),
    ("group-writable file", [("/etc/p.yaml", 0, FILE | 0o664)], "/etc/p.yaml", False, "writable by others"),
    ("in /tmp", [("/tmp/p.yaml", 0, FILE | 0o644)], "/tmp/p.yaml", False, "/tmp"),
    ("in the workdir", [("/home/op/work/p.yaml", CONTROL, FILE | 0o644)], "/home/op/work/p.yaml", False, "work"),
    (
        "dir owned by the agent",
        [("/etc/a", AGENT, DIR | 0o755), ("/etc/a/p.yaml", 0, FILE | 0o644)],
        "/etc/a/p.yaml",
        False,
        "/etc/a is owned by uid 61000",
    ),
    (
        "world-writable dir",
        [("/etc/a", 0, DIR | 0o777), ("/etc/a/p.yaml", 0, FILE | 0o644)],
        "/etc/a/p.yaml",
        False,
        "writable by others",
    ),
    (
        "sticky dir, trusted entry",
        [("/var/tmp/a", 0, DIR | 0o755), ("/var/tmp/a/p.yaml", 0, FILE | 0o644)],
        "/var/tmp/a/p.yaml",
        True,
        "",
    ),
    (
        "sticky dir, agent's entry",
        [("/var/tmp/a", AGENT, DIR | 0o755), ("/var/tmp/a/p.yaml", 0, FILE | 0o644)],
        "/var/tmp/a/p.yaml",
        False,
        "uid 61000",
    ),
    ("sticky dir, agent's file", [("/var/tmp/p.yaml", AGENT, FILE | 0o644)], "/var/tmp/p.yaml", False, "writable"),
    (
        "symlink into the workdir",
        [("/etc/p.yaml", 0, LINK | 0o777, "/home/op/work/p.yaml"), ("/home/op/work/p.yaml", CONTROL, FILE | 0o644)],
        "/etc/p.yaml",
        False,
        "work",
    ),
    (
        "symlink through an agent dir",
        [
            ("/etc/p.yaml", 0, LINK | 0o777, "../var/tmp/x/p.yaml"),
            ("/var/tmp/x", AGENT, DIR | 0o755),
            ("/var/tmp/x/p.yaml", 0, FILE | 0o644),
        ],
        "/etc/p.yaml",
        False,
        "uid 61000",
    ),
    (
        "symlink to a safe file",
        [("/etc/p.yaml", 0, LINK | 0o777, "/etc/real.yaml"), ("/etc/real.yaml", 0, FILE | 0o644)],
        "/etc/p.yaml",
        True,
        "/etc/real.yaml",
    ),
    (
        "symlink in an agent dir to a safe file",
        [
            ("/etc/a", AGENT, DIR | 0o755),
            ("/etc/a/p.yaml", AGENT, LINK | 0o777, "/etc/real.yaml"),
            ("/etc/real.yaml", 0, FILE | 0o644),
        ],
        "/etc/a/p.yaml",
        False,
        "/etc/a",
    ),
    (
        "symlink loop",
        [("/etc/l1", 0, LINK | 0o777, "/etc/l2"), ("/etc/l2", 0, LINK | 0o777, "/etc/l1")],
        "/etc/l1",
        False,
        "symbolic links",
    ),
    ("missing", [], "/etc/none.yaml", False, "No such file"),
    ("a directory", [], "/etc", False, "not a regular file"),
    ("relative", [], "p.yaml", False, "absolute"),
    (
        "dot-dot climbing into /tmp",
        [("/etc/a", 0, DIR | 0o755), ("/tmp/p.yaml", 0, FILE | 0o644)],
        "/etc/a/../../tmp/p.yaml",
        False,
        "/tmp",
    ),
]


@pytest.mark.parametrize(("name", "extra", "path", "safe", "word"), CASES, ids=[c[0] for c in CASES])
def test_rules(name: str, extra: list[tuple[object, ...]], path: str, safe: bool, word: str) -> None:
    fs = base()
    for entry in extra:
        fs.add(*entry)  # type: ignore[arg-type]
    ok, reason = verdict(fs, path)
    assert ok is safe, reason
    assert word in reason


def configmap(fs: FakeFs, stamp: str, *, read_only: bool = True) -> FakeFs:
    """A kubelet ConfigMap volume: a 0777 root directory, a timestamped data dir, ``..data`` and the key as
    symlinks, mounted read-only."""
    fs.add("/etc/openshell", 0, DIR | 0o755).add("/etc/openshell/policy", 0, DIR | 0o777)
    fs.add(f"/etc/openshell/policy/{stamp}", 0, DIR | 0o755)
    fs.add(f"/etc/openshell/policy/{stamp}/policy.yaml", 0, FILE | 0o644)
    fs.add("/etc/openshell/policy/..data", 0, LINK | 0o777, stamp)
    fs.add("/etc/openshell/policy/policy.yaml", 0, LINK | 0o777, "..data/policy.yaml")
    if read_only:
        fs.ro.add("/etc/openshell/policy")
    return fs


def test_configmap_volume_passes() -> None:
    fs = configmap(base(), "..2026_12_01_14_00_00.123")
    v = check_watch("/etc/openshell/policy/policy.yaml", agent_writable=WRITABLE, trusted_uids=TRUSTED, fs=fs)
    assert v.safe, v.reason
    assert v.resolved == "/etc/openshell/policy/..2026_12_01_14_00_00.123/policy.yaml"


def test_configmap_volume_after_the_data_swap_still_passes() -> None:
    fs = configmap(base(), "..2026_12_01_14_00_00.123")
    configmap(fs, "..2026_12_01_14_05_00.456")  # kubelet writes the new dir, then renames ..data over
    v = check_watch("/etc/openshell/policy/policy.yaml", agent_writable=WRITABLE, trusted_uids=TRUSTED, fs=fs)
    assert v.safe and v.resolved.endswith("14_05_00.456/policy.yaml"), v.reason


def test_the_same_tree_read_write_is_refused() -> None:
    """The 0777 directory is fine only because the mount is read-only."""
    fs = configmap(base(), "..2026_12_01_14_00_00.123", read_only=False)
    ok, reason = verdict(fs, "/etc/openshell/policy/policy.yaml")
    assert not ok and "writable by others" in reason


def test_read_only_mount_outweighs_an_agent_owner() -> None:
    fs = base().add("/srv", AGENT, DIR | 0o755).add("/srv/p.yaml", AGENT, FILE | 0o666)
    assert not verdict(fs, "/srv/p.yaml")[0]
    fs.ro.add("/srv")
    assert verdict(fs, "/srv/p.yaml")[0]


def test_agent_writable_paths_resolve_and_include_the_defaults() -> None:
    paths = agent_writable_paths(["/home/op/work"], ["/data", "/tmp"])
    assert paths[:2] == ("/tmp", "/dev/shm") and "/home/op/work" in paths and "/data" in paths
    assert len(paths) == len(set(paths))
