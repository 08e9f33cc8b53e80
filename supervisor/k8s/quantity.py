"""Kubernetes resource quantities for render's flags (``--resources``, ``--memory-limit``, ``--workspace-size``).

Render adds quantities (the container's memory limit is the workload's plus the boundary's headroom; the
ephemeral-storage limit is the workspace plus the container's own writes), so it reads them to bytes and
writes the sums back exactly. Only the forms an operator writes for sizes are accepted: a whole number with an
optional decimal (``k``, ``M``, ``G``, ``T``) or binary (``Ki``, ``Mi``, ``Gi``, ``Ti``) suffix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "BOUNDARY_MEMORY_HEADROOM",
    "CONTAINER_STORAGE_HEADROOM",
    "Resources",
    "format_bytes",
    "parse_bytes",
    "parse_cpu",
]

_SIZE = re.compile(r"([0-9]{1,15})(k|M|G|T|Ki|Mi|Gi|Ti)?")
_FACTOR = {
    None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip
_CPU = re.compile(r"([0-9]{1,6})(\.[0-9]{1,3})?|[0-9]{1,9}m")

# What the boundary (PID 1 of the workload container, outside the workload's memory cgroup) may use on top of
# the workload's limit: a trio process with its links and buffers stays well under it (docs/kubernetes.md).
BOUNDARY_MEMORY_HEADROOM = 256 * 2**20
# The container's own writes besides the workspace: its writable layer and its logs.
CONTAINER_STORAGE_HEADROOM = 2**30


def parse_bytes(text: str, flag: str) -> int:
    """Bytes of a size quantity; ``ValueError`` naming ``flag`` otherwise."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{flag}: {text!r} is not a size like 512Mi, 2Gi or 1G")
    return int(match.group(1)) * _FACTOR[match.group(2)]


def format_bytes(value: int) -> str:
    """The shortest exact binary form: ``2304Mi``, ``3Gi``, or plain bytes."""
    for suffix in ("Ti", "Gi", "Mi", "Ki"):
        if value and value % _FACTOR[suffix] == 0:
            return f"{value // _FACTOR[suffix]}{suffix}"
    return str(value)


def parse_cpu(text: str, flag: str) -> str:
    if not _CPU.fullmatch(text) or text.strip("0.m") == "":
        raise ValueError(f"{flag}: {text!r} is not a CPU quantity like 250m or 2")
    return text


@dataclass(frozen=True)
class Resources:
    """One container's requests and memory limit, as quantities (``--resources ROLE=cpu=…,memory=…,limit-memory=…``)."""

    cpu: str
    memory: str
    limit_memory: str

    def with_text(self, text: str, flag: str) -> Resources:
        """These resources changed by ``cpu=…,memory=…,limit-memory=…`` (any subset)."""
        values = {"cpu": self.cpu, "memory": self.memory, "limit-memory": self.limit_memory}
        for item in text.split(","):
            key, eq, value = item.partition("=")
            if not eq or key not in values:
                raise ValueError(f"{flag}: {item!r} is not cpu=Q, memory=Q or limit-memory=Q")
            values[key] = parse_cpu(value, flag) if key == "cpu" else format_bytes(parse_bytes(value, flag))
        out = Resources(values["cpu"], values["memory"], values["limit-memory"])
        if parse_bytes(out.memory, flag) > parse_bytes(out.limit_memory, flag):
            raise ValueError(f"{flag}: memory={out.memory} is above limit-memory={out.limit_memory}")
        return out
