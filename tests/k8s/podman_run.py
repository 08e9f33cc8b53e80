"""A rendered pod that ``podman kube play`` (4.3.1) cannot give what it asks for, started field by field instead.

``kube play`` makes a user namespace only through ``--userns=auto`` (a ``containers`` range in /etc/subuid and
/etc/subgid, which these hosts lack) and ignores ``procMount``, so model U's workload pod (``hostUsers: false``,
``procMount: Unmasked``) would run without the user namespace and with a masked /proc, and its boundary stops
(``mount proc: Operation not permitted``). This module turns such a pod into ``podman pod create`` (rootful
``--uidmap``/``--gidmap``: no subordinate ids needed) and one ``podman run`` per container.

Every field of the pod, of each container and of each security context is either translated here or refused:
an unknown field, or a value this translation cannot reproduce, raises ``TranslationError`` naming it, so a
security setting is never dropped on the way to the runtime. What each field becomes is in ``POD_FIELDS``,
``CONTAINER_FIELDS`` and ``SECURITY_FIELDS`` (docs/kubernetes.md, "Running the companion set under podman").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.k8s.quantity import parse_bytes

Doc = dict[str, Any]
USERNS_SIZE = 65536  # the ids kubelet maps for a hostUsers: false pod

POD_FIELDS = {
    "hostUsers": "false: the pod's user namespace, --uidmap/--gidmap 0:BASE:65536 on podman pod create",
    "securityContext": "the pod's defaults for each container's context (below); fsGroup as the Secret files' "
    "group and a supplemental group",
    "restartPolicy": "--restart of the containers (Never: no, OnFailure: on-failure, Always: always)",
    "terminationGracePeriodSeconds": "--stop-timeout of each container, -t of podman pod rm",
    "shareProcessNamespace": "--share of podman pod create (ipc,net,uts; pid as well when true)",
    "automountServiceAccountToken": "false only: podman mounts no token",
    "enableServiceLinks": "false only: podman sets no service variables",
    "initContainers": "podman run --pod, each to completion in order, kept after it exited",
    "containers": "podman run -d --pod",
    "volumes": "hostPath directories made by the translation (podman_play.py), bind-mounted",
}
CONTAINER_FIELDS = {
    "name": "--name <pod>-<name>",
    "image": "the image",
    "command": "--entrypoint (as JSON)",
    "args": "the arguments after the image",
    "env": "--env, Secret references resolved (podman_play.py)",
    "volumeMounts": "-v HOST:MOUNTPATH[:ro] (name, mountPath, readOnly only)",
    "resources": "requests.cpu: --cpu-shares; requests.memory: --memory-reservation; limits.cpu: --cpus; "
    "limits.memory: --memory; ephemeral-storage: not applied",
    "securityContext": "below",
    "ports": "dropped: nothing is published on the host; the pod is reached at its address",
    "readinessProbe": "dropped: the run execs the probe's command itself",
    "livenessProbe": "dropped: the run execs the probe's command itself",
    "startupProbe": "dropped: the run execs the probe's command itself",
}
SECURITY_FIELDS = {
    "runAsUser": "--user UID:GID",
    "runAsGroup": "--user UID:GID",
    "runAsNonRoot": "true: refused unless runAsUser is set and not 0 (kubelet refuses to start it)",
    "privileged": "false only",
    "allowPrivilegeEscalation": "false: --security-opt no-new-privileges",
    "readOnlyRootFilesystem": "true: --read-only --read-only-tmpfs=false",
    "capabilities": "drop: --cap-drop each (ALL included); add: --cap-add each",
    "seccompProfile": "RuntimeDefault: podman's default profile (containers/common, CRI-O's RuntimeDefault); "
    "Unconfined: --security-opt seccomp=unconfined; Localhost refused",
    "procMount": "Unmasked: --security-opt unmask=ALL (no masked and no read-only /proc paths, as the CRI "
    "runtimes do); Default: nothing",
}
POD_SECURITY_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "supplementalGroups", "seccompProfile"}


class TranslationError(Exception):
    """The rendered set holds something this translation does not know how to play."""


def refuse_unknown(obj: Mapping[str, Any], where: str, known: Mapping[str, Any] | set[str]) -> None:
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise TranslationError(f"{where}: {', '.join(unknown)} not translated (podman would not apply it)")


@dataclass
class PodRun:
    """The podman invocations that start one pod, in order, and the one that removes it."""

    name: str
    create: list[str]  # podman pod create …, without the network (given at play)
    inits: list[list[str]]  # podman run …, each to completion
    mains: list[list[str]]  # podman run -d …
    grace: int

    def commands(self, network: str, address: str) -> list[list[str]]:
        return [[*self.create, "--network", network, "--ip", address], *self.inits, *self.mains]

    def down(self) -> list[str]:
        return ["pod", "rm", "-f", "-t", str(self.grace), self.name]


def _cpu_shares(quantity: str) -> int:
    millis = int(quantity[:-1]) if quantity.endswith("m") else round(float(quantity) * 1000)
    return max(2, millis * 1024 // 1000)  # kubelet's conversion of a CPU request to cgroup shares


def _resources(resources: Doc, where: str) -> list[str]:
    refuse_unknown(resources, where, {"requests", "limits"})
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    refuse_unknown(requests, f"{where}.requests", {"cpu", "memory", "ephemeral-storage"})
    refuse_unknown(limits, f"{where}.limits", {"cpu", "memory", "ephemeral-storage"})
    args = []
    if "cpu" in requests:
        args += ["--cpu-shares", str(_cpu_shares(str(requests["cpu"])))]
    if "memory" in requests:
        args += ["--memory-reservation", str(parse_bytes(str(requests["memory"]), f"{where}.requests.memory"))]
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        args += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
    if "memory" in limits:
        args += ["--memory", str(parse_bytes(str(limits["memory"]), f"{where}.limits.memory"))]
    return args


def _security(context: Doc, where: str) -> list[str]:
    """The container's effective context (the pod's defaults under its own) as podman flags."""
    refuse_unknown(context, where, SECURITY_FIELDS)
    args: list[str] = []
    uid, gid = context.get("runAsUser"), context.get("runAsGroup")
    if gid is not None and uid is None:
        raise TranslationError(f"{where}: runAsGroup without runAsUser not translated")
    if context.get("runAsNonRoot") and (uid is None or int(uid) == 0):
        raise TranslationError(f"{where}: runAsNonRoot needs a runAsUser other than 0 here")
    if uid is not None:
        args += ["--user", f"{int(uid)}:{int(gid)}" if gid is not None else str(int(uid))]
    if context.get("privileged", False) is not False:
        raise TranslationError(f"{where}: privileged: true not translated")
    if context.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if context.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    capabilities = context.get("capabilities") or {}
    refuse_unknown(capabilities, f"{where}.capabilities", {"add", "drop"})
    for cap in capabilities.get("drop") or []:
        args += ["--cap-drop", str(cap)]
    for cap in capabilities.get("add") or []:
        args += ["--cap-add", str(cap)]
    seccomp = context.get("seccompProfile")
    if seccomp is not None:
        refuse_unknown(seccomp, f"{where}.seccompProfile", {"type"})
        if seccomp.get("type") == "Unconfined":
            args += ["--security-opt", "seccomp=unconfined"]
        elif seccomp.get("type") != "RuntimeDefault":
            raise TranslationError(f"{where}.seccompProfile: type {seccomp.get('type')!r} not translated")
    proc_mount = context.get("procMount", "Default")
    if proc_mount == "Unmasked":
        args += ["--security-opt", "unmask=ALL"]
    elif proc_mount != "Default":
        raise TranslationError(f"{where}.procMount: {proc_mount!r} not translated")
    return args


def pod_run(
    spec: Doc,
    name: str,
    labels: Mapping[str, str],
    volumes: Mapping[str, Path],
    userns_base: int,
    env: Callable[[Sequence[Doc]], list[Doc]],
) -> PodRun:
    """``spec``: the rendered pod spec, untouched; ``volumes``: each volume's host directory, already made
    (owned by the mapped ids); ``env``: the translation of a container's ``env`` to plain values."""
    refuse_unknown(spec, "pod", POD_FIELDS)
    if spec.get("hostUsers", True) is not False:
        raise TranslationError("pod: this translation is for hostUsers: false (kube play plays the others)")
    for flag in ("automountServiceAccountToken", "enableServiceLinks"):
        if spec.get(flag, True) is not False:
            raise TranslationError(f"pod: {flag} other than false not translated")
    pod_context: Doc = spec.get("securityContext") or {}
    refuse_unknown(pod_context, "pod.securityContext", POD_SECURITY_FIELDS)
    groups = [int(g) for g in pod_context.get("supplementalGroups") or []]
    if pod_context.get("fsGroup") is not None:
        groups.append(int(pod_context["fsGroup"]))
    defaults = {k: v for k, v in pod_context.items() if k in SECURITY_FIELDS}
    grace = int(spec.get("terminationGracePeriodSeconds", 30))
    restart = {"Never": "no", "OnFailure": "on-failure", "Always": "always"}.get(spec.get("restartPolicy", "Always"))
    if restart is None:
        raise TranslationError(f"pod: restartPolicy {spec.get('restartPolicy')!r} not translated")
    share = "ipc,net,uts,pid" if spec.get("shareProcessNamespace") else "ipc,net,uts"
    ids = f"0:{userns_base}:{USERNS_SIZE}"
    create = ["pod", "create", "--name", name, "--infra-name", f"{name}-infra", "--share", share,
              "--uidmap", ids, "--gidmap", ids]  # fmt: skip
    for key, value in labels.items():
        create += ["--label", f"{key}={value}"]
    declared = set()
    for volume in spec.get("volumes") or []:
        declared.add(volume["name"])
        if volume["name"] not in volumes:
            raise TranslationError(f"pod: volume {volume['name']} has no host directory")

    def container_args(container: Doc, kind: str) -> list[str]:
        where = f"{kind} {container.get('name')}"
        refuse_unknown(container, where, CONTAINER_FIELDS)
        args = ["--pod", name, "--name", f"{name}-{container['name']}", "--stop-timeout", str(grace)]
        args += [arg for g in groups for arg in ("--group-add", str(g))]
        args += _security({**defaults, **(container.get("securityContext") or {})}, f"{where}.securityContext")
        args += _resources(container.get("resources") or {}, f"{where}.resources")
        for mount in container.get("volumeMounts") or []:
            refuse_unknown(mount, f"{where}.volumeMounts", {"name", "mountPath", "readOnly"})
            if mount["name"] not in declared:
                raise TranslationError(f"{where}: volumeMount {mount['name']} names no volume of the pod")
            mode = ":ro" if mount.get("readOnly") else ""
            args += ["-v", f"{volumes[mount['name']]}:{mount['mountPath']}{mode}"]
        for var in env(container.get("env") or []):
            args += ["--env", f"{var['name']}={var['value']}"]
        if "command" in container:
            args += ["--entrypoint", json.dumps(list(container["command"]))]
        return [*args, str(container["image"]), *[str(a) for a in container.get("args") or []]]

    inits = [["run", "--restart", "no", *container_args(c, "initContainer")] for c in spec.get("initContainers") or []]
    mains = [["run", "-d", "--restart", restart, *container_args(c, "container")] for c in spec["containers"]]
    return PodRun(name=name, create=create, inits=inits, mains=mains, grace=grace)
