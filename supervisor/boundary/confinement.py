"""What the agent may touch on the filesystem: its mount layout (R, U) and its Landlock rules (every model), from
the policy's static sections (docs/reference/policy.md §1.2, docs/design.md "Default filesystem").

Rules of this module:

1. Two layers in models R and U: the agent's own root (``forkimage/rootfs.py``: only granted trees exist,
   read-only ones are read-only mounts, ``/proc`` read-only) and Landlock inside it. Model P has no mount
   namespace: Landlock is its only layer.
2. With no ``filesystem_policy`` the agent gets the safe default set, never ``/`` writable: read the system
   trees, ``/proc``, the trust directory and the resolver configuration (in R and U all of its own root);
   write the workdir, ``/tmp``, ``/dev/shm``, the usual device nodes and ``/dev/pts`` (and in R and U its
   private ``/run/lock`` and ``/run/user/<uid>``).
3. With one, the workload may read ``read_only`` and write ``read_write`` (plus the workdir with
   ``include_workdir``); a small baseline is always added so that processes work at all and can read the CA
   files the boundary gives them.
4. Landlock never grants write at or under ``/proc`` (a ptrace equivalent through ``/proc/PID/mem``), nor on
   ``/``: such ``read_write`` entries are granted read-only (control refuses them at load already).
5. Every launch gets a Landlock domain: its scoping (ABI >= 6) is what stops a workload of the boundary's own
   uid (models U and P) from signalling the boundary or its launcher.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal

from supervisor.boundary.forkimage import LandlockSpec
from supervisor.boundary.forkimage.rootfs import SYSTEM_READ_ONLY, TRUST_PATH, RootPlan, plan_root
from supervisor.protocol.attach import FilesystemSection, StaticPolicy
from supervisor.protocol.privilege_model import PrivilegeModel
from supervisor.protocol.writable_paths import writable_problem

DEVICES_READ_WRITE = (
    "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts", "/dev/ptmx",
    "/dev/shm",
)  # fmt: skip
BASELINE_READ_ONLY = ("/proc", TRUST_PATH)


def resolver_files(resolv_conf: str = "/etc/resolv.conf") -> tuple[str, ...]:
    """Where ``/etc/resolv.conf`` really is when it is a symlink (systemd-resolved's file under ``/run``)."""
    if os.path.islink(resolv_conf):
        real = os.path.realpath(resolv_conf)
        if os.path.isfile(real):
            return (real,)
    return ()


def _filesystem(static_policy: StaticPolicy) -> FilesystemSection | None:
    fs = static_policy.filesystem
    if fs is None or (not fs.read_only and not fs.read_write):
        return None
    return fs


def landlock_for(
    static_policy: StaticPolicy,
    workdir: str,
    *,
    model: PrivilegeModel = PrivilegeModel.R,
    agent_uid: int | None = None,
    trust_dir: str | None = None,
) -> LandlockSpec:
    """The Landlock rules of one launch. ``trust_dir``: where the trust files are in the agent's view when it
    is not ``TRUST_PATH`` (model P reads them where the boundary writes them)."""
    compatibility = static_policy.landlock_compatibility or "best_effort"
    mode: Literal["best_effort", "hard_requirement"] = (
        "hard_requirement" if compatibility == "hard_requirement" else "best_effort"
    )
    trust = (TRUST_PATH,) if trust_dir is None else (TRUST_PATH, trust_dir)
    fs = _filesystem(static_policy)
    if fs is None:  # rule 2
        private_run = (
            (("/run/lock", f"/run/user/{agent_uid}") if agent_uid is not None else ())
            if model != PrivilegeModel.P
            else ()
        )
        # R and U: "/" is the agent's own root, holding only what it was granted (listing it is harmless)
        view = ("/",) if model != PrivilegeModel.P else ()
        read_only: list[str] = [*view, *SYSTEM_READ_ONLY, "/proc", *trust, *resolver_files()]
        read_write: list[str] = [workdir, "/tmp", *DEVICES_READ_WRITE, *private_run]
    else:  # rule 3
        read_write = [*fs.read_write, *DEVICES_READ_WRITE]
        if fs.include_workdir:
            read_write.append(workdir)
        read_only = [*fs.read_only, *BASELINE_READ_ONLY, *trust[1:], *resolver_files()]
    safe_write, demoted = _split_writable(read_write)
    read_only += demoted
    return LandlockSpec(read_only=tuple(dict.fromkeys(read_only)), read_write=tuple(dict.fromkeys(safe_write)),
                        mode=mode)  # fmt: skip


def _split_writable(paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """Rule 4: (paths Landlock may grant write on, paths granted read-only instead)."""
    ok: list[str] = []
    demoted: list[str] = []
    for path in paths:
        (demoted if writable_problem(path) is not None else ok).append(path)
    return ok, demoted


def root_for(
    static_policy: StaticPolicy,
    workdir: str,
    *,
    trust_dir: str,
    agent_uid: int,
    agent_gid: int,
    hide: Iterable[str],
    tmp_size: str,
    shm_size: str,
) -> RootPlan:
    """The agent's mount layout in models R and U (rule 1); raises ``rootfs.RootError`` naming the path."""
    fs = _filesystem(static_policy)
    read_only = [] if fs is None else list(fs.read_only)
    read_write = [] if fs is None else list(fs.read_write)
    safe_write, demoted = _split_writable(read_write)
    return plan_root(
        workdir=workdir, read_only=[*read_only, *demoted], read_write=safe_write, trust_dir=trust_dir,
        agent_uid=agent_uid, agent_gid=agent_gid, hide=hide, tmp_size=tmp_size, shm_size=shm_size,
        workdir_writable=fs is None or fs.include_workdir,
    )  # fmt: skip
