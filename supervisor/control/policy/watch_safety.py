"""Is a policy file safe to hot-reload? (docs/design.md "Settled details": the agent never touches its policy.)

Control re-reads its policy file when it changes. That is only safe when the agent cannot be the one changing
it: a file the agent can rewrite — or rename something over, or reach through a symlink it controls — would let
it grant itself any host about a second later. So a file is watched only when, on the path as the kernel
resolves it:

1. no directory traversed, and not the file itself, lies inside a path the agent can write (its workdir, the
   policy's ``read_write`` paths, ``/tmp``);
2. every directory traversed is owned by a trusted uid (root or control's own) and writable by nobody else:
   no group or other write bit — unless the directory is *sticky* and the entry looked up in it is owned by a
   trusted uid (then only that owner or the directory's owner can rename or remove it, e.g. ``/var/tmp/x``);
3. the file itself is owned by a trusted uid and has no group or other write bit;
4. a directory or file on a read-only mount counts as not writable whatever its owner and mode say (a
   Kubernetes ConfigMap volume: a 0777 root-owned directory, ``..data`` a symlink to a timestamped directory,
   the file a symlink through ``..data``, all mounted read-only);
5. symlinks are followed as the kernel does (at most 40); each symlink is an entry of the directory that
   holds it, so rule 2 on that directory is what protects it; the target is then checked like any path.

Everything about the filesystem comes through :class:`FsView`, so the rules are unit-tested on a fake tree and
the real one is :data:`HOST`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

MAX_SYMLINKS: Final = 40


@dataclass(frozen=True)
class Node:
    """What ``lstat`` says about one path component."""

    uid: int
    mode: int  # st_mode: file type and permission bits


class FsView(Protocol):
    def lstat(self, path: str) -> Node: ...

    def readlink(self, path: str) -> str: ...

    def read_only(self, path: str) -> bool:
        """True when ``path`` (an existing file or directory, no symlink) is on a read-only mount."""
        ...


class _HostFs:
    def lstat(self, path: str) -> Node:
        st = os.lstat(path)
        return Node(st.st_uid, st.st_mode)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def read_only(self, path: str) -> bool:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


HOST: Final[FsView] = _HostFs()


@dataclass(frozen=True)
class WatchVerdict:
    safe: bool
    reason: str  # why not, or what was checked
    resolved: str  # the path the kernel would open (as far as resolution got)


def _inside(path: str, roots: Iterable[str]) -> str | None:
    for root in roots:
        if root == "/" or path == root or path.startswith(root.rstrip("/") + "/"):
            return root
    return None


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def _writable_by_others(mode: int) -> bool:
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def check_watch(
    path: str, *, agent_writable: Iterable[str], trusted_uids: Iterable[int], fs: FsView = HOST
) -> WatchVerdict:
    """May control hot-reload ``path``? ``agent_writable`` are absolute, already-resolved paths."""
    if not path.startswith("/"):
        return WatchVerdict(False, f"{path}: not an absolute path", path)
    roots = tuple(agent_writable)
    trusted = frozenset(trusted_uids)
    todo = [part for part in path.split("/") if part]
    current = "/"
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            if name == ".":
                continue
            if name == "..":
                current = _parent(current)
                continue
            child = _join(current, name)
            node = fs.lstat(child)
            problem = _directory_problem(current, node, roots, trusted, fs)
            if problem is not None:
                return WatchVerdict(False, problem, child)
            if stat.S_ISLNK(node.mode):
                links += 1
                if links > MAX_SYMLINKS:
                    return WatchVerdict(False, f"{path}: too many levels of symbolic links", child)
                target = fs.readlink(child)
                todo = [part for part in target.split("/") if part] + todo
                if target.startswith("/"):
                    current = "/"
                continue
            if todo and not stat.S_ISDIR(node.mode):
                return WatchVerdict(False, f"{child}: not a directory", child)
            current = child
        return _file_verdict(current, roots, trusted, fs)
    except OSError as exc:
        return WatchVerdict(False, f"{exc.filename or path}: {exc.strerror or exc}", current)


def _directory_problem(
    directory: str, entry: Node, roots: tuple[str, ...], trusted: frozenset[int], fs: FsView
) -> str | None:
    """Why an entry of ``directory`` could be replaced by someone untrusted, or None."""
    root = _inside(directory, roots)
    if root is not None:
        return f"{directory} is inside {root}, which the agent can write"
    if fs.read_only(directory):
        return None
    info = fs.lstat(directory)
    if info.uid not in trusted:
        return f"{directory} is owned by uid {info.uid} (only root or control's uid may own it)"
    if not _writable_by_others(info.mode):
        return None
    if info.mode & stat.S_ISVTX:
        if entry.uid in trusted:
            return None  # sticky: only the entry's owner (trusted) or the directory's owner can replace it
        return (
            f"{directory} is writable by others (mode {stat.S_IMODE(info.mode):04o}) and the entry in it is "
            f"owned by uid {entry.uid}"
        )
    return f"{directory} is writable by others (mode {stat.S_IMODE(info.mode):04o})"


def _file_verdict(path: str, roots: tuple[str, ...], trusted: frozenset[int], fs: FsView) -> WatchVerdict:
    root = _inside(path, roots)
    if root is not None:
        return WatchVerdict(False, f"{path} is inside {root}, which the agent can write", path)
    info = fs.lstat(path)
    if not stat.S_ISREG(info.mode):
        return WatchVerdict(False, f"{path}: not a regular file", path)
    if fs.read_only(path):
        return WatchVerdict(True, f"{path}: on a read-only mount", path)
    if info.uid not in trusted:
        return WatchVerdict(False, f"{path} is owned by uid {info.uid} (only root or control's uid may own it)", path)
    if _writable_by_others(info.mode):
        return WatchVerdict(False, f"{path} is writable by others (mode {stat.S_IMODE(info.mode):04o})", path)
    return WatchVerdict(True, f"{path}: owned by uid {info.uid}, writable only by its owner", path)


DEFAULT_AGENT_WRITABLE: Final = ("/tmp", "/dev/shm")


def agent_writable_paths(extra: Iterable[str], read_write: Iterable[str]) -> tuple[str, ...]:
    """The resolved paths the agent may write: the defaults, the caller's (the workdir) and ``read_write``."""
    out: list[str] = []
    for path in (*DEFAULT_AGENT_WRITABLE, *extra, *read_write):
        resolved = os.path.realpath(path)
        if resolved not in out:
            out.append(resolved)
    return tuple(out)


def watch_guard(path: Path, agent_writable: tuple[str, ...]) -> Callable[[], str | None]:
    """A re-check for the watcher: why ``path`` is not (or no longer) safe to hot-reload, or None. Trusted
    uids are root and the caller's (control's) effective uid."""
    absolute = os.path.abspath(path)

    def guard() -> str | None:
        verdict = check_watch(absolute, agent_writable=agent_writable, trusted_uids=(0, os.geteuid()))
        return None if verdict.safe else verdict.reason

    return guard


def decide_watch(path: Path | None, disabled: bool, agent_writable: tuple[str, ...]) -> tuple[Path | None, str]:
    """(the file to watch or None, why): what control logs as ``policy.watch`` and dev mode prints."""
    if path is None:
        return None, "no policy file: the embedded default is fixed"
    if disabled:
        return None, f"{path}: loaded once (--no-policy-watch); change it with `policy apply`"
    reason = watch_guard(path, agent_writable)()
    if reason is not None:
        return None, f"{path}: loaded once, not watched ({reason}); change it with `policy apply`"
    return path, f"{path}: watched for revisions"
