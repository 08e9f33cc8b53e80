"""Dev mode's default agent uid/gid: a dedicated one nobody uses (docs/design.md "Settled details").

An agent run as an existing user's uid owns that user's files (uid 1000 is usually a real person here). Dev
mode therefore picks, from :data:`AGENT_ID_RANGE`, the first id that is

1. not a uid in the password database nor a gid in the group database (``getpwuid``/``getgrgid``, so NSS
   sources count too),
2. not inside a subordinate-id range of ``/etc/subuid`` or ``/etc/subgid`` (rootless containers' ids),
3. not the real, effective, saved or filesystem uid or gid of any running process (``/proc/*/status``),
4. not the owner of anything directly inside the places users keep files: ``/home/*``, ``/tmp``,
   ``/var/tmp``, ``/dev/shm``, ``/run/user`` (a full filesystem scan is too slow to run at every start),
5. not reserved by another dev mode on this machine: the chosen id's lock file under :data:`RESERVATIONS` is
   held (``flock``) for this process's life, so two sandboxes started at the same moment — before either
   agent runs — never share an agent uid.

The range 61000-61183 sits in Debian's block for globally allocated system ids (60000-64999), which nothing
allocates on these machines, and just below systemd's ``DynamicUser=`` range (61184-65519). The same number is
used for the uid and the gid. ``--agent-user`` overrides the choice; container images keep their own ``agent``
user (1000:1000).
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

AGENT_ID_RANGE: Final = range(61000, 61184)
FILE_PLACES: Final = ("/home", "/tmp", "/var/tmp", "/dev/shm", "/run/user")
RESERVATIONS: Final = "/run/lock/openshell-sandbox-agent-ids"
_held: list[int] = []  # lock fds of the ids this process reserved, open until it exits


def _reserve(ident: int, directory: str = RESERVATIONS) -> bool:
    """Take ``ident``'s lock for this process's life; False when another process holds it."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd = os.open(os.path.join(directory, f"{ident}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    _held.append(fd)
    return True


class NoFreeAgentId(Exception):
    pass


def _in_database(ident: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(ident)
            return True
        except KeyError:
            pass
    return False


def _subordinate_ranges(files: Iterable[str] = ("/etc/subuid", "/etc/subgid")) -> list[range]:
    out: list[range] = []
    for name in files:
        try:
            text = Path(name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.strip().split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                out.append(range(int(parts[1]), int(parts[1]) + int(parts[2])))
    return out


def _process_ids(proc: str = "/proc") -> set[int]:
    ids: set[int] = set()
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            text = Path(proc, entry, "status").read_text()
        except OSError:
            continue  # gone meanwhile
        for line in text.splitlines():
            if line.startswith(("Uid:", "Gid:")):
                ids.update(int(field) for field in line.split()[1:])
    return ids


def _file_owners(places: Iterable[str] = FILE_PLACES) -> set[int]:
    owners: set[int] = set()
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            owners.update((st.st_uid, st.st_gid))
    return owners


def pick_agent_id(
    *,
    in_database: Callable[[int], bool] = _in_database,
    subordinate: Callable[[], list[range]] = _subordinate_ranges,
    process_ids: Callable[[], set[int]] = _process_ids,
    file_owners: Callable[[], set[int]] = _file_owners,
    candidates: range = AGENT_ID_RANGE,
    reserve: Callable[[int], bool] = _reserve,
) -> int:
    """The first unused id of ``candidates`` (rules 1-5 of this module); the checks are injectable for tests."""
    busy = process_ids() | file_owners()
    ranges = subordinate()
    for ident in candidates:
        if ident in busy or any(ident in r for r in ranges) or in_database(ident):
            continue
        if not reserve(ident):
            continue
        return ident
    raise NoFreeAgentId(
        f"no unused id in {candidates.start}-{candidates.stop - 1} for the agent; pass --agent-user UID:GID"
    )
