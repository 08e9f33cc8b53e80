"""The agent's view of the filesystem in models R and U (docs/design.md "Default filesystem", "Trust files").

Rules of this module:

1. The agent's mount namespace starts empty: a fresh tmpfs root holding only what is granted, bubblewrap-style.
   Read-only: the system trees (``SYSTEM_READ_ONLY``, absent ones skipped, top-level symlinks such as
   ``/bin -> usr/bin`` recreated as symlinks), the policy's ``read_only`` paths and the trust directory at
   ``TRUST_PATH``. Read-write: the workdir and the policy's ``read_write`` paths. Never ``/`` read-write.
2. Synthetic trees, never the host's: a size-capped private ``/tmp`` and ``/dev/shm``; a minimal ``/dev``
   (``DEVICES`` bound from the host, a new devpts instance, ``/dev/ptmx`` and ``/dev/fd`` links); ``/proc``
   read-only (no ``/proc/PID/mem`` writes, whatever Landlock says); a private ``/run`` skeleton (the target of
   ``/etc/resolv.conf`` when it points into ``/run``, ``/run/lock``, ``/run/user/<uid>`` 0700 of the agent,
   the trust directory). A policy naming ``/tmp``, ``/run`` or anything in ``/proc`` or ``/dev`` gets the
   synthetic ones; only a path the policy names below ``/tmp`` or ``/run`` is bound from the host. Homes,
   ``/var/lib``, the host's ``/run`` and ``/tmp`` (and the sockets in them) are simply absent.
3. Read-only means read-only mounts, every submount included, keeping the flags the source had (a remount in
   a user namespace may add ``MS_RDONLY`` but not drop locked flags): chmod, utime and setxattr fail too.
4. Hidden paths (``--hide-path``) inside a granted tree are covered by an empty 0000 file or directory on a
   read-only bind; a hidden path outside every granted tree is absent already.
5. ``plan_root`` is pure planning on the boundary's (the host's) view: every path resolved, nothing mounted.
   ``enter`` runs in the launcher's forking process (the PID namespace's init, or the zygote without one),
   single-threaded, right before its first workload child: it unshares a mount namespace of its own, builds
   the root there and stays in it, so every workload child is forked inside. Only ``CAP_SYS_ADMIN`` is needed
   (no ``setns``, which would also need ``CAP_SYS_CHROOT``, absent from model R's pod). Nothing is imported
   after it: the capture setup and its calls all ran before the agent was started.
6. The agent has an account: ``/etc/passwd`` and ``/etc/group`` are the host's with a ``sandbox`` user and group
   for the agent's uid and gid (home: the workdir) where the host names none — dev mode's dedicated ids are
   nobody's, and a prompt must not read ``I have no name!``. Read-only files of our own bound over the host's.

Theory of operation (``build``): after ``unshare(CLONE_NEWNS)`` everything is made private, a tmpfs is mounted
on ``/tmp`` and becomes the root with ``pivot_root`` — the old root then sits, complete, at ``/.oldroot``
(including the ``/tmp`` the tmpfs covered). Host paths are bound from there. Finally ``/.oldroot`` is detached
and the root itself remounted read-only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from supervisor.protocol.json_value import JsonValue

from . import linux

SYSTEM_READ_ONLY: Final = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt")
SYNTHETIC: Final = ("/proc", "/dev", "/tmp", "/run")  # rule 2: never bound from the host as a whole
SYNTHETIC_TREES: Final = ("/proc", "/dev")  # nothing below these is bound from the host either
DEVICES: Final = ("null", "zero", "full", "random", "urandom", "tty")
TRUST_PATH: Final = "/run/openshell-boundary/tls"
DEFAULT_TMP_SIZE: Final = "256m"
DEFAULT_SHM_SIZE: Final = "64m"
_SIZE: Final = re.compile(r"[1-9][0-9]{0,12}[kmg]?")
_STAGE: Final = "/tmp"
_OLD: Final = "/.oldroot"
_HIDE: Final = "/.hide"
_ST_TO_MS: Final = (
    (os.ST_NOSUID, linux.MS_NOSUID),
    (os.ST_NODEV, linux.MS_NODEV),
    (os.ST_NOEXEC, linux.MS_NOEXEC),
    (os.ST_NOATIME, linux.MS_NOATIME),
    (os.ST_NODIRATIME, linux.MS_NODIRATIME),
)


class RootError(ValueError):
    """The requested layout cannot be built (names the path at fault)."""


@dataclass(frozen=True)
class Bind:
    source: str  # the host's path (resolved)
    target: str  # where the agent sees it
    writable: bool
    directory: bool


@dataclass(frozen=True)
class RootPlan:
    binds: tuple[Bind, ...]
    symlinks: tuple[tuple[str, str], ...]  # (path, link text), e.g. ("/bin", "usr/bin")
    hide: tuple[str, ...]
    agent_uid: int
    agent_gid: int
    tmp_size: str = DEFAULT_TMP_SIZE
    shm_size: str = DEFAULT_SHM_SIZE
    home: str | None = None  # the agent's home in its /etc/passwd entry (the workdir); None: no entry written

    def to_wire(self) -> dict[str, JsonValue]:
        return {
            "binds": [[b.source, b.target, b.writable, b.directory] for b in self.binds],
            "symlinks": [list(s) for s in self.symlinks],
            "hide": list(self.hide),
            "agent_uid": self.agent_uid,
            "agent_gid": self.agent_gid,
            "tmp_size": self.tmp_size,
            "shm_size": self.shm_size,
            "home": self.home,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> RootPlan:
        return cls(
            binds=tuple(Bind(str(s), str(t), bool(w), bool(d)) for s, t, w, d in data["binds"]),
            symlinks=tuple((str(p), str(t)) for p, t in data["symlinks"]),
            hide=tuple(str(h) for h in data["hide"]),
            agent_uid=int(data["agent_uid"]),
            agent_gid=int(data["agent_gid"]),
            tmp_size=check_size(str(data["tmp_size"]), "tmp_size"),
            shm_size=check_size(str(data["shm_size"]), "shm_size"),
            home=str(data["home"]) if data.get("home") is not None else None,
        )


def check_size(text: str, name: str) -> str:
    """A tmpfs ``size=`` value: a positive number with an optional ``k``/``m``/``g`` suffix."""
    value = text.strip().lower()
    if not _SIZE.fullmatch(value):
        raise RootError(f"{name}: {text!r} is not a size like 256m, 64m or 1g")
    return value


def under(path: str, tree: str) -> bool:
    return tree == "/" or path == tree or path.startswith(tree.rstrip("/") + "/")


def _depth_key(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


# --- planning (the boundary, host's view) --------------------------------------------------------------
def plan_root(
    *,
    workdir: str,
    read_only: Iterable[str] = (),
    read_write: Iterable[str] = (),
    trust_dir: str | None,
    agent_uid: int,
    agent_gid: int,
    hide: Iterable[str] = (),
    tmp_size: str = DEFAULT_TMP_SIZE,
    shm_size: str = DEFAULT_SHM_SIZE,
    resolv_conf: str = "/etc/resolv.conf",
    host_root: str = "/",
    workdir_writable: bool = True,
) -> RootPlan:
    """Rule 1, 2 and 4 as a list of binds. ``host_root`` lets tests plan against a fake tree. The workdir is
    always there (it is the agent's cwd), read-only when a policy leaves it out (``include_workdir: false``)."""
    if os.path.normpath(workdir) == "/" or not os.path.isabs(workdir):
        raise RootError(f"workdir: {workdir!r} must be an absolute path other than /")
    view = _HostView(host_root)
    grants = _Grants(view)
    grants.system()
    for path in read_only:
        grants.grant(path, False, "read_only")
    for path in read_write:
        grants.grant(path, True, "read_write")
    real_workdir = _real_workdir(view, workdir)
    grants.writable[real_workdir] = grants.writable.get(real_workdir, False) or workdir_writable
    binds = [
        Bind(source=target, target=target, writable=writable, directory=os.path.isdir(view.host(target)))
        for target, writable in grants.writable.items()
    ]
    binds += _resolv_conf_bind(view, resolv_conf)
    binds += _trust_bind(view, trust_dir)
    return RootPlan(
        binds=tuple(sorted(binds, key=lambda b: _depth_key(b.target))),
        symlinks=tuple(grants.symlinks),
        hide=tuple(dict.fromkeys(_hidden(view, hide, real_workdir))),
        agent_uid=agent_uid,
        agent_gid=agent_gid,
        tmp_size=check_size(tmp_size, "tmp_size"),
        shm_size=check_size(shm_size, "shm_size"),
        home=os.path.normpath(workdir),
    )


class _HostView:
    """The host's tree as a plan reads it, rooted at ``host_root`` (a fake tree in tests)."""

    def __init__(self, host_root: str) -> None:
        self.host_root = host_root

    def host(self, path: str) -> str:
        return os.path.join(self.host_root, path.lstrip("/"))

    def resolve(self, path: str) -> str | None:
        """The host path without symlinks, as seen from ``/`` (None when absent)."""
        real = os.path.realpath(self.host(path))
        if not os.path.exists(real):
            return None
        rel = os.path.relpath(real, os.path.realpath(self.host_root))
        return "/" if rel == "." else "/" + rel if not rel.startswith("..") else None


class _Grants:
    """The trees bound into the root (rule 1), each once, writable if any grant of it is, and the system
    paths that are symlinks, recreated as such."""

    def __init__(self, view: _HostView) -> None:
        self.view = view
        self.writable: dict[str, bool] = {}  # target -> writable
        self.symlinks: list[tuple[str, str]] = []

    def system(self) -> None:
        """The system's read-only trees that exist, and the ones that are symlinks as symlinks."""
        for path in SYSTEM_READ_ONLY:
            if os.path.islink(self.view.host(path)):
                self.symlinks.append((path, os.readlink(self.view.host(path))))
            elif os.path.isdir(self.view.host(path)):
                self.writable.setdefault(path, False)

    def grant(self, path: str, writable: bool, field: str) -> None:
        if not os.path.isabs(path):
            raise RootError(f"{field}: {path!r} is not an absolute path")
        if os.path.normpath(path) == "/":
            if writable:
                raise RootError(f"{field}: / cannot be writable")
            for name in sorted(os.listdir(self.view.host("/"))):  # "/" read-only: every tree but the synthetic
                if not any(under("/" + name, tree) for tree in SYNTHETIC):
                    self.grant("/" + name, False, field)
            return
        real = self.view.resolve(path)
        if real is None or real in ("/", *SYNTHETIC) or any(under(real, tree) for tree in SYNTHETIC_TREES):
            return  # absent, or provided by the synthetic trees (rule 2)
        self.writable[real] = self.writable.get(real, False) or writable


def _real_workdir(view: _HostView, workdir: str) -> str:
    """The workdir as it resolves on the host: it exists, and is neither ``/`` nor in a synthetic tree."""
    real = view.resolve(workdir)
    if real is None:
        raise RootError(f"workdir: {workdir} does not exist")
    if real == "/":
        raise RootError(f"workdir: {workdir!r} resolves to /")
    if any(under(real, tree) for tree in ("/proc", "/dev", "/run")):
        raise RootError(f"workdir: {workdir!r} lies in /proc, /dev or /run")
    return real


def _resolv_conf_bind(view: _HostView, resolv_conf: str) -> list[Bind]:
    """A resolv.conf that is a symlink into ``/run`` (a synthetic tree, rule 2): the file it points to, read-only."""
    if os.path.islink(view.host(resolv_conf)):
        real = view.resolve(resolv_conf)
        if real is not None and under(real, "/run") and os.path.isfile(view.host(real)):
            return [Bind(source=real, target=real, writable=False, directory=False)]
    return []


def _trust_bind(view: _HostView, trust_dir: str | None) -> list[Bind]:
    """The boundary's trust directory, read-only at ``TRUST_PATH``."""
    if trust_dir is None:
        return []
    real = view.resolve(trust_dir)
    if real is None or not os.path.isdir(view.host(real)):
        raise RootError(f"tls-dir: {trust_dir} is not a directory")
    return [Bind(source=real, target=TRUST_PATH, writable=False, directory=True)]


def _hidden(view: _HostView, hide: Iterable[str], real_workdir: str) -> list[str]:
    """The hidden paths that exist (rule 4); none may hold the workdir."""
    hidden = [r for r in (view.resolve(h) for h in hide) if r is not None and r != "/"]
    for path in hidden:
        if under(real_workdir, path):
            raise RootError(f"hide-path: {path} holds the workdir {real_workdir}: the agent could not enter it")
    return hidden


# --- building (the launcher, single-threaded) ----------------------------------------------------------
def enter(plan: RootPlan) -> None:
    """Move the calling process into a new mount namespace holding the agent's root (rule 5). On failure the
    caller must never fork a workload child: its namespace is half-built."""
    linux.unshare(linux.CLONE_NEWNS)
    _build_here(plan)
    os.chdir("/")


def _step(what: str, path: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except OSError as exc:
        raise OSError(exc.errno or errno.EINVAL, f"agent root: {what} {path}: {exc.strerror or exc}") from None


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _step("mount", target, linux.mount, source, target, fstype, flags, data)


def _build_here(plan: RootPlan) -> None:
    _mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    _mount("tmpfs", _STAGE, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=0755,size=4m")
    os.mkdir(_STAGE + _OLD, 0o700)
    _step("pivot_root into", _STAGE, linux.pivot_root, _STAGE, _STAGE + _OLD)
    os.chdir("/")
    for path, text in plan.symlinks:
        os.symlink(text, path)
    _proc()
    _dev(plan.shm_size, plan.agent_uid, plan.agent_gid)
    _tmpfs("/tmp", 0o1777, plan.tmp_size, linux.MS_NOSUID | linux.MS_NODEV)
    _run(plan.agent_uid, plan.agent_gid)
    for bind in plan.binds:
        _bind(bind)
    _accounts(plan)
    _hide(plan.hide)
    _step("detach", _OLD, linux.umount2, _OLD, linux.MNT_DETACH)
    os.rmdir(_OLD)
    _readonly("/", recursive=False)
    _readonly("/dev", recursive=False)


def _mkdirs(path: str) -> None:
    """Create ``path``'s directories (0755) in the new root; never through a symlink."""
    current = ""
    for part in _depth_key(path):
        current += "/" + part
        if os.path.islink(current):
            raise OSError(errno.ELOOP, f"agent root: {current} is a symlink on the way to {path}")
        if not os.path.exists(current):
            _step("mkdir", current, os.mkdir, current, 0o755)
            os.chmod(current, 0o755)


def _mountpoint(path: str, directory: bool) -> None:
    _mkdirs(os.path.dirname(path))
    if os.path.islink(path):
        raise OSError(errno.ELOOP, f"agent root: {path} is a symlink")
    if directory:
        _mkdirs(path)
    elif not os.path.exists(path):
        _step("create", path, lambda: os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)))
    if os.path.realpath(path) != path:
        raise OSError(errno.ELOOP, f"agent root: {path} leads through a symlink")


def _bind(bind: Bind) -> None:
    _mountpoint(bind.target, bind.directory)
    _mount(_OLD + bind.source, bind.target, None, linux.MS_BIND | linux.MS_REC)
    if not bind.writable:
        _readonly(bind.target, recursive=True)


def _flags_of(path: str) -> int:
    """The mount flags ``path``'s mount has now, as ``MS_*`` for a bind remount (rule 3)."""
    st = os.statvfs(path)
    flags = 0
    for st_flag, ms_flag in _ST_TO_MS:
        if st.f_flag & st_flag:
            flags |= ms_flag
    if not st.f_flag & (os.ST_NOATIME | os.ST_RELATIME):
        flags |= linux.MS_STRICTATIME
    return flags


def _mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path`` in our namespace, parents first (from our mountinfo)."""
    with open(_OLD + "/proc/self/mountinfo") as fh:
        points = [_unescape(line.split()[4]) for line in fh]
    return sorted({p for p in points if under(p, path) and not under(p, _OLD)}, key=_depth_key)


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _readonly(path: str, *, recursive: bool) -> None:
    for point in _mounts_under(path) if recursive else [path]:
        flags = linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | _flags_of(point)
        _mount(None, point, None, flags)


def _tmpfs(path: str, mode: int, size: str, flags: int) -> None:
    _mkdirs(path)
    _mount("tmpfs", path, "tmpfs", flags, f"mode={mode:o},size={size}")


def _proc() -> None:
    """The launcher's ``/proc`` (the workload PID namespace's, when there is one), read-only (rule 2)."""
    _mkdirs("/proc")
    _mount(_OLD + "/proc", "/proc", None, linux.MS_BIND | linux.MS_REC)
    _readonly("/proc", recursive=False)


def _dev(shm_size: str, uid: int, gid: int) -> None:
    """The synthetic ``/dev`` (rule 2). Its devpts instance gives every new terminal to the agent's uid and gid,
    so the terminal a launch gets (terminal.py) is the agent's own to reopen by name (``tty``, ssh, gpg)."""
    _tmpfs("/dev", 0o755, "256k", linux.MS_NOSUID | linux.MS_NOEXEC)
    for name in DEVICES:
        source = f"{_OLD}/dev/{name}"
        if not os.path.exists(source):
            continue
        _mountpoint(f"/dev/{name}", directory=False)
        _mount(source, f"/dev/{name}", None, linux.MS_BIND)
    _mkdirs("/dev/pts")
    _mount(
        "devpts",
        "/dev/pts",
        "devpts",
        linux.MS_NOSUID | linux.MS_NOEXEC,
        f"newinstance,ptmxmode=0666,mode=0620,uid={uid},gid={gid}",
    )
    os.symlink("pts/ptmx", "/dev/ptmx")
    _tmpfs("/dev/shm", 0o1777, shm_size, linux.MS_NOSUID | linux.MS_NODEV)
    os.symlink("/proc/self/fd", "/dev/fd")
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", f"/dev/{name}")


def _run(uid: int, gid: int) -> None:
    _tmpfs("/run", 0o755, "4m", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    for path, mode in (("/run/lock", 0o1777), ("/run/user", 0o755)):
        os.mkdir(path)
        os.chmod(path, mode)
    # The agent's runtime directory is a tmpfs created with its owner: a chown would need CAP_CHOWN, which
    # model R's pod does not have (docs/kubernetes.md "Model R"; found by running the pod, tests/k8s).
    os.mkdir(f"/run/user/{uid}", 0o700)
    flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    _mount("tmpfs", f"/run/user/{uid}", "tmpfs", flags, f"mode=0700,uid={uid},gid={gid},size=4m")


AGENT_NAME: Final = "sandbox"


def account_lines(passwd: str, group: str, *, uid: int, gid: int, home: str, shell: str) -> tuple[str, str]:
    """The agent's ``/etc/passwd`` and ``/etc/group`` (rule 6): the host's, plus a ``sandbox`` entry for its uid
    and gid when the host has none (a host entry of that name for other ids is left out, so the name is one
    account's). Pure: tests give it any text."""

    def fields(line: str) -> list[str]:
        return line.split(":")

    def numbered(lines: list[str], number: int) -> bool:
        return any(len(f := fields(line)) > 2 and f[2] == str(number) for line in lines)

    users = [line for line in passwd.splitlines() if line.strip()]
    groups = [line for line in group.splitlines() if line.strip()]
    if not numbered(users, uid):
        users = [line for line in users if fields(line)[0] != AGENT_NAME]
        users.append(f"{AGENT_NAME}:x:{uid}:{gid}:openshell-sandbox agent:{home}:{shell}")
    if not numbered(groups, gid):
        groups = [line for line in groups if fields(line)[0] != AGENT_NAME]
        groups.append(f"{AGENT_NAME}:x:{gid}:")
    return "\n".join(users) + "\n", "\n".join(groups) + "\n"


def _accounts(plan: RootPlan) -> None:
    """Rule 6: read-only files of our own over the bound ``/etc/passwd`` and ``/etc/group``; the sources are
    unlinked at once (the mounts keep them), so nothing of them stays in the root's own tmpfs."""
    if plan.home is None:
        return
    texts: list[str] = []
    for path in ("/etc/passwd", "/etc/group"):
        if not os.path.isfile(path) or os.path.realpath(path) != path:
            return
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            texts.append(fh.read())
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"  # as the environment's SHELL, where it exists
    made = account_lines(texts[0], texts[1], uid=plan.agent_uid, gid=plan.agent_gid, home=plan.home, shell=shell)
    for path, text in zip(("/etc/passwd", "/etc/group"), made, strict=True):
        source = "/.account-" + os.path.basename(path)
        fd = os.open(source, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, text.encode("utf-8", "surrogateescape"))
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        _mount(source, path, None, linux.MS_BIND)
        _mount(None, path, None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | _flags_of(path))
        os.unlink(source)


def _hide(paths: Iterable[str]) -> None:
    """Rule 4: an empty 0000 directory or file over each hidden path that is visible in the new root."""
    paths = [p for p in paths if os.path.lexists(p) and os.path.realpath(p) == p]
    if not paths:
        return
    os.mkdir(_HIDE, 0o700)
    empty_dir, empty_file = _HIDE + "/d", _HIDE + "/f"
    os.mkdir(empty_dir, 0)
    os.close(os.open(empty_file, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0))
    os.chmod(empty_dir, 0)
    os.chmod(empty_file, 0)
    for path in paths:
        source = empty_dir if stat.S_ISDIR(os.lstat(path).st_mode) else empty_file
        _mount(source, path, None, linux.MS_BIND)
        sealed = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
        _mount(None, path, None, linux.MS_REMOUNT | linux.MS_BIND | sealed | _flags_of(path))
    with contextlib.suppress(OSError):
        os.rmdir(empty_dir)
        os.unlink(empty_file)
        os.rmdir(_HIDE)
