"""``policy check``'s look at this machine: binary entries that name no file here.

A policy is checked where it is written, usually on a machine like the one the agent runs on; a ``binaries`` path
that exists nowhere (``/usr/bin/pyhton3``) is a rule that never matches. Control cannot say so itself: it runs in
another pod than the workload's image, so only this command, on the user's machine, warns — and ``--strict``
makes the warning an error. A glob is reported only when it matches nothing here (one with ``**`` or ``{a,b}``
is not judged).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import yaml

from supervisor.control.policy import Policy, PolicyWarning


def absent_binaries(policy: Policy, path: Path) -> list[PolicyWarning]:
    """One warning per binary entry that matches no file on this machine, with its line where it can be found."""
    lines = _binary_lines(path)
    found: list[PolicyWarning] = []
    for rule in policy.network_policies:
        for index, binary in enumerate(rule.binaries):
            if _present(binary.path):
                continue
            where = f"network_policies.{rule.key}.binaries[{index}].path"
            message = (
                f"binary path {binary.path!r} matches no file on this machine; the rule never matches a process "
                "running it (a typo?)"
            )
            found.append(PolicyWarning(where, message, lines.get((rule.key, index)), str(path)))
    return found


def _present(pattern: str) -> bool:
    if not any(c in pattern for c in "*?[{"):
        return os.path.lexists(pattern)
    if "**" in pattern or "{" in pattern:  # a whole tree, or alternatives glob.glob cannot spell: not judged
        return True
    return any(True for _ in glob.iglob(pattern))


def _binary_lines(path: Path) -> dict[tuple[str, int], int]:
    """(rule key, index) → 1-based line of that binary entry's ``path``; empty when the file cannot be read again."""
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    lines: dict[tuple[str, int], int] = {}
    for rules in _values(root, "network_policies"):
        if not isinstance(rules, yaml.MappingNode):
            continue
        for key_node, rule in rules.value:
            for binaries in _values(rule, "binaries"):
                if not isinstance(binaries, yaml.SequenceNode):
                    continue
                for index, entry in enumerate(binaries.value):
                    target = next(iter(_values(entry, "path")), entry)
                    lines[(str(key_node.value), index)] = target.start_mark.line + 1
    return lines


def _values(node: object, key: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        return []
    return [value for name, value in node.value if isinstance(name, yaml.ScalarNode) and name.value == key]
