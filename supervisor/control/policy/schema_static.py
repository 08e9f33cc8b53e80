"""The static sections of a policy (docs/reference/policy.md §1.2): fixed for the sandbox's life, read by the boundary.

``filesystem_policy`` paths are absolute, without ``..``, at most 4096 characters and 256 in total, and
``read_write`` is never ``/`` nor at or under ``/proc`` (``supervisor/protocol/writable_paths.py``);
``landlock.compatibility`` is ``best_effort`` or ``hard_requirement``;
``process.run_as_user``/``run_as_group`` are ``sandbox`` or a numeric id in 1..4294967294 (root refused).
"""

from __future__ import annotations

import yaml

from supervisor.protocol.writable_paths import writable_problem

from .model import Compatibility, FilesystemPolicy, LandlockPolicy, ProcessPolicy
from .yamlnodes import Reader

MAX_FS_PATHS = 256
MAX_FS_PATH_LEN = 4096
MAX_ID = 4294967294

Node = yaml.Node


def read_filesystem(r: Reader, node: Node) -> FilesystemPolicy | None:
    base = "filesystem_policy"
    items = r.mapping(node, base)
    if items is None:
        return None
    r.check_keys(items, base, ("include_workdir", "read_only", "read_write"))
    include = False
    if "include_workdir" in items:
        include = bool(r.boolean(items["include_workdir"][1], f"{base}.include_workdir"))
    lists: dict[str, tuple[str, ...]] = {}
    total = 0
    for key in ("read_only", "read_write"):
        paths: list[str] = []
        if key in items:
            seq = r.sequence(items[key][1], f"{base}.{key}") or []
            for i, item in enumerate(seq):
                where = f"{base}.{key}[{i}]"
                value = r.string(item, where, allow_empty=False)
                if value is None:
                    continue
                if not value.startswith("/"):
                    r.error(where, item, f"path {value!r} is not absolute", "an absolute path")
                elif ".." in value.split("/"):
                    r.error(where, item, f"path {value!r} contains a '..' component")
                elif len(value) > MAX_FS_PATH_LEN:
                    r.error(where, item, f"path is longer than {MAX_FS_PATH_LEN} characters")
                elif key == "read_write" and (problem := writable_problem(value)) is not None:
                    r.error(where, item, f"read_write {value!r} {problem}")
                else:
                    paths.append(value)
            total += len(seq)
        lists[key] = tuple(paths)
    if total > MAX_FS_PATHS:
        r.error(base, node, f"{total} filesystem paths; at most {MAX_FS_PATHS} are allowed")
    return FilesystemPolicy(include, lists["read_only"], lists["read_write"])


def read_landlock(r: Reader, node: Node) -> LandlockPolicy | None:
    base = "landlock"
    items = r.mapping(node, base)
    if items is None:
        return None
    r.check_keys(items, base, ("compatibility",))
    if "compatibility" not in items:
        return LandlockPolicy()
    value = r.string(items["compatibility"][1], f"{base}.compatibility")
    if value is None:
        return None
    try:
        return LandlockPolicy(Compatibility(value))
    except ValueError:
        r.error(
            f"{base}.compatibility",
            items["compatibility"][1],
            f"unknown compatibility {value!r}",
            "best_effort or hard_requirement",
        )
        return None


def read_process(r: Reader, node: Node) -> ProcessPolicy | None:
    base = "process"
    items = r.mapping(node, base)
    if items is None:
        return None
    r.check_keys(items, base, ("run_as_user", "run_as_group"))
    ids: dict[str, str | None] = {"run_as_user": None, "run_as_group": None}
    for key in ids:
        if key not in items:
            continue
        value_node = items[key][1]
        value = r.value(value_node) if isinstance(value_node, yaml.ScalarNode) else None
        text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) else None
        if text == "sandbox" or (text is not None and text.isdigit() and 1 <= int(text) <= MAX_ID):
            ids[key] = text if text == "sandbox" else str(int(text))
        else:
            r.error(
                f"{base}.{key}",
                value_node,
                f"invalid id {value!r}",
                f"'sandbox' or a numeric id in 1..{MAX_ID} (0/root is refused)",
            )
    return ProcessPolicy(ids["run_as_user"], ids["run_as_group"])
