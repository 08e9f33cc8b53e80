"""The podman translation step: what ``k8s render`` writes, turned into pods ``podman kube play`` (4.3) runs.

Podman 4.3 plays Pods (and Deployments, under names of its own), but not ``kind: Secret``, Secret or emptyDir
volumes, Services or NetworkPolicies. So, for each of the two pods of one sandbox:

- a **Deployment** becomes the Pod of its template, named after the Deployment (one replica: the pod a
  Deployment would run); ``podman kube down`` + a new play with fresh directories is a Deployment replacing it;
- a **Secret volume** becomes a hostPath directory holding the Secret's files as kubelet writes them: owner root,
  group the pod's ``fsGroup`` (else root), mode ``defaultMode`` (the render's 0400 / 0440), in a 0700 parent;
- a **ConfigMap volume** becomes a hostPath directory of 0644 files (mounted read-only, as in the manifests);
- an **emptyDir** becomes a fresh, empty 0777 hostPath directory (on disk, not memory: ``medium: Memory`` and
  ``sizeLimit`` are not reproduced);
- the one **Service** becomes the address of the pod it selects on the podman network (no name lookup, no
  aardvark): in the boundary topology the workload pod's, control's ``--boundary=os-bnd-…:PORT`` becoming
  ``--boundary=ADDRESS:PORT``; in the proxy-pod topology control's, the workload's proxy variables
  (``http://sandbox:…@os-prx-…:PORT``) naming ``ADDRESS:PORT`` instead;
- an env **secretKeyRef** becomes the Secret's value (podman 4.3 reads it only from ``podman secret``s), and
  ``$(VAR)`` in a later value is expanded as kubelet does (the proxy token in the proxy variables);
- the pod-level ``runAsUser``/``runAsGroup``/``fsGroup`` are written into each container's own context (``fsGroup``
  as a supplemental group, which is what kubelet does for the processes), so nothing depends on how podman reads
  the pod-level context;
- init containers are kept after they ran (podman's ``always`` type; its ``once`` removal races their exit);
- ``restartPolicy: Always`` (a Deployment's pod) becomes ``OnFailure`` when the pod has init containers: podman
  4.3 applies the pod's policy to init containers too, so an init container that exited 0 was started again,
  in a loop, for the pod's whole life; control's ``secrets-copy`` then rewrote the bootstrap key under control,
  which now and then read half a file at start (``key.pem: not an unencrypted PEM private key``), exited and was
  restarted. Kubernetes runs an init container once; a daemon exiting non-zero is still restarted, one exiting
  0 is not (neither daemon exits 0 while it should run);
- ``ports`` are dropped: podman 4.3's ``kube play`` publishes every ``containerPort`` on the host (the
  boundary's 7443, control's proxy 3128: reachable from the host, and two runs side by side, or a dev sandbox
  holding 3128, collide); the pods reach each other by address on the network, as in a cluster;
- probes are dropped (podman runs them through systemd timers, which these hosts lack); the run calls
  ``readyz``/``status`` through ``podman exec`` instead;
- a container security context key kube play does not apply (``procMount`` other than ``Default``, a seccomp
  type other than ``RuntimeDefault``, any key not listed in ``KUBE_PLAY_SECURITY_FIELDS``) is refused, and so is
  a volume field not listed in ``_volumes``; ``appArmorProfile`` is dropped (these hosts have no AppArmor);
- a pod with ``hostUsers: false`` (model U's workload) is not played but started field by field with ``podman
  pod create --uidmap/--gidmap 0:BASE:65536`` and ``podman run`` (tests/k8s/podman_run.py, strict: it refuses
  any field it does not translate), BASE of the run's choosing, and every hostPath file of that pod is owned by
  the mapped ids (what kubelet's idmapped mounts do; runc 1.1 has none).

NetworkPolicies are not translated: the podman network is ``--internal`` (nothing leaves the machine), but
nothing fences the workload pod from the other containers on it. docs/kubernetes.md ("Running the companion set
under podman") says what this run changes and what it cannot show.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.podman_run import PodRun, TranslationError, pod_run, refuse_unknown

__all__ = ["PlayPod", "Translation", "TranslationError", "load_documents"]

Doc = dict[str, Any]


# The container security context keys podman 4.3.1's kube play applies as kubelet would (runAsNonRoot and the
# seccomp type are checked here: podman's default profile is the RuntimeDefault CRI-O uses); any other key, or
# procMount other than Default (which kube play ignores), is refused rather than dropped.
KUBE_PLAY_SECURITY_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "privileged", "allowPrivilegeEscalation",
                             "readOnlyRootFilesystem", "capabilities", "seccompProfile", "procMount"}  # fmt: skip


@dataclass
class PlayPod:
    """One translated pod: the YAML ``podman kube play`` gets, or (``run``) the podman commands that start it."""

    name: str
    role: str  # "control" | "workload"
    doc: Doc
    yaml_path: Path
    run: PodRun | None = None  # a hostUsers: false pod: podman pod create + podman run (tests/k8s/podman_run.py)
    containers: list[str] = field(default_factory=list)  # podman's names: <pod>-<container>
    init_containers: list[str] = field(default_factory=list)

    def start(self, network: str, address: str) -> list[list[str]]:
        """The podman invocations that start the pod at ``address`` on ``network``, in order."""
        if self.run is not None:
            return self.run.commands(network, address)
        return [["kube", "play", "--network", network, "--ip", address, str(self.yaml_path)]]

    def down(self) -> list[str]:
        """The podman invocation that removes the pod and its containers."""
        return self.run.down() if self.run is not None else ["kube", "down", str(self.yaml_path)]


def _kube_play_context(context: Doc, where: str) -> None:
    refuse_unknown(context, where, KUBE_PLAY_SECURITY_FIELDS)
    if context.get("procMount", "Default") != "Default":
        raise TranslationError(f"{where}: procMount {context['procMount']!r}: kube play ignores it")
    seccomp = context.get("seccompProfile") or {"type": "RuntimeDefault"}
    if seccomp != {"type": "RuntimeDefault"}:
        raise TranslationError(f"{where}: seccompProfile {seccomp} not translated")
    if context.get("runAsNonRoot") and not context.get("runAsUser"):
        raise TranslationError(f"{where}: runAsNonRoot needs a runAsUser other than 0 here")


def load_documents(*paths: Path) -> list[Doc]:
    docs: list[Doc] = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text("utf-8")):
            if doc:
                docs.append(doc)
    return docs


def _secret_files(secret: Doc) -> dict[str, bytes]:
    files = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    files.update({k: str(v).encode() for k, v in (secret.get("stringData") or {}).items()})
    return files


def _write_files(directory: Path, files: Mapping[str, bytes], mode: int, gid: int, base: int = 0) -> None:
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    os.chown(directory, base, base)
    for name, content in files.items():
        if "/" in name or name.startswith("."):
            raise TranslationError(f"{directory.name}: key {name!r} is not a plain file name")
        path = directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.chown(path, base, base + gid)
        os.chmod(path, mode)


class Translation:
    """The rendered objects and Secrets of one sandbox, and the pods made of them under ``work``."""

    def __init__(self, objects: Sequence[Doc], secrets: Sequence[Doc], work: Path, userns_base: int = 0) -> None:
        """``userns_base``: the host uid/gid that uid/gid 0 of a ``hostUsers: false`` pod maps to."""
        self.work = work
        self.userns_base = userns_base
        self.objects = list(objects)
        self.secrets = {s["metadata"]["name"]: s for s in secrets if s.get("kind") == "Secret"}
        self.configmaps = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "ConfigMap"}
        services = [o for o in objects if o.get("kind") == "Service"]
        if len(services) != 1:
            raise TranslationError(f"expected one Service (the boundary's or the proxy's), found {len(services)}")
        self.service = services[0]
        self.plays = 0
        work.mkdir(mode=0o700, exist_ok=True)
        os.chmod(work, 0o700)

    def pod_doc(self, role: str) -> Doc:
        for obj in self.objects:
            labels = obj.get("metadata", {}).get("labels", {})
            if labels.get("openshell.ai/sandbox-role") != role:
                continue
            if obj.get("kind") == "Pod":
                return obj
            if obj.get("kind") == "Deployment":
                template = obj["spec"]["template"]
                return {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": obj["metadata"]["name"], "labels": dict(template["metadata"]["labels"])},
                    "spec": template["spec"],
                }
        raise TranslationError(f"no Pod or Deployment with role {role!r} in the rendered set")

    def service_name(self) -> str:
        return str(self.service["metadata"]["name"])

    def translate(
        self,
        role: str,
        *,
        service_address: str,
        extra_args: Sequence[str] = (),
        extra_mounts: Mapping[str, Path] = {},
    ) -> PlayPod:
        """A fresh play of the ``role`` pod (fresh emptyDirs each time, as a new pod gets).

        ``service_address`` is the address of the pod the rendered Service selects (the workload pod in the
        boundary topology, control's in proxy-pod): the Service's name becomes it.

        ``extra_args`` are appended to the main container's args (control: ``--dns-server``, ``--upstream-ca``);
        ``extra_mounts`` maps a container path to a host directory, mounted read-only into the main container.
        """
        self.plays += 1
        source = self.pod_doc(role)
        spec: Doc = yaml.safe_load(yaml.safe_dump(source["spec"]))  # a deep copy, plain types only
        name = str(source["metadata"]["name"])
        root = self.work / f"{self.plays:02d}-{role}"
        root.mkdir(mode=0o700)
        pod_context = spec.get("securityContext") or {}
        fs_group = pod_context.get("fsGroup")
        gid = int(fs_group) if fs_group is not None else 0
        if spec.get("hostUsers", True) is False:
            if extra_args or extra_mounts:
                raise TranslationError("extra args and mounts are for kube-played pods")
            if not self.userns_base:
                raise TranslationError("hostUsers: false needs a userns_base (the host ids the pod's map to)")
            paths = self._volumes(spec, root, gid, self.userns_base)
            run = pod_run(spec, name, source["metadata"]["labels"], paths, self.userns_base,
                          lambda env: self._env(env, service_address))  # fmt: skip
            containers = [f"{name}-{c['name']}" for c in spec["containers"]]
            inits = [f"{name}-{c['name']}" for c in spec.get("initContainers", [])]
            return PlayPod(name=name, role=role, doc=source, yaml_path=root / "pod.yaml", run=run,
                           containers=containers, init_containers=inits)  # fmt: skip
        spec.pop("securityContext", None)
        pod_keys = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "seccompProfile"}
        refuse_unknown(pod_context, "pod.securityContext", pod_keys)
        _kube_play_context({k: v for k, v in pod_context.items() if k != "fsGroup"}, "pod.securityContext")
        paths = self._volumes(spec, root, gid, 0)
        volumes = [{"name": n, "hostPath": {"path": str(p), "type": "Directory"}} for n, p in paths.items()]

        for kind in ("initContainers", "containers"):
            for container in spec.get(kind, []):
                container.pop("ports", None)  # podman 4.3 would publish each containerPort on the host (above)
                container.pop("readinessProbe", None)
                container.pop("livenessProbe", None)
                container.pop("startupProbe", None)
                context = container.setdefault("securityContext", {})
                context.pop("appArmorProfile", None)  # no AppArmor on these hosts (docs: what it cannot show)
                for key in ("runAsUser", "runAsGroup", "runAsNonRoot"):
                    if key in pod_context and key not in context:
                        context[key] = pod_context[key]
                _kube_play_context(context, f"{container['name']}.securityContext")
        if fs_group is not None:
            spec["securityContext"] = {"supplementalGroups": [gid]}
        if spec.get("initContainers") and spec.get("restartPolicy", "Always") == "Always":
            spec["restartPolicy"] = "OnFailure"  # podman restarts init containers by the pod's policy (above)

        for kind in ("initContainers", "containers"):
            for container in spec.get(kind, []):
                if "env" in container:
                    container["env"] = self._env(container["env"], service_address)
        main = spec["containers"][0]
        if role == "control":
            main["args"] = [self._boundary_arg(a, service_address) for a in main.get("args", [])]
        main["args"] = [*main.get("args", []), *extra_args]
        for index, (mount_path, host) in enumerate(sorted(extra_mounts.items())):
            vol_name = f"extra-{index}"
            volumes.append({"name": vol_name, "hostPath": {"path": str(host), "type": "Directory"}})
            main.setdefault("volumeMounts", []).append({"name": vol_name, "mountPath": mount_path, "readOnly": True})
        spec["volumes"] = volumes

        metadata: Doc = {"name": name, "labels": source["metadata"]["labels"]}
        if spec.get("initContainers"):
            # podman 4.3 removes a "once" init container after it exits and sometimes tries while it still runs
            # ("cannot remove container … as it is running"); "always" keeps it (exited) instead.
            metadata["annotations"] = {"io.podman.annotations.init.container.type": "always"}
        doc = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
        yaml_path = root / "pod.yaml"
        yaml_path.write_text(yaml.safe_dump(doc, sort_keys=False), "utf-8")
        containers = [f"{name}-{c['name']}" for c in spec["containers"]]
        inits = [f"{name}-{c['name']}" for c in spec.get("initContainers", [])]
        return PlayPod(name=name, role=role, doc=doc, yaml_path=yaml_path, containers=containers,
                       init_containers=inits)  # fmt: skip

    def _volumes(self, spec: Doc, root: Path, gid: int, base: int) -> dict[str, Path]:
        """Each volume's host directory under ``root``, filled as kubelet would, owned by ids from ``base``."""
        paths: dict[str, Path] = {}
        for volume in spec.get("volumes", []):
            vol_name = volume["name"]
            path = root / vol_name
            refuse_unknown(volume, f"volume {vol_name}", {"name", "secret", "configMap", "emptyDir"})
            if "secret" in volume:
                refuse_unknown(volume["secret"], f"volume {vol_name}.secret", {"secretName", "defaultMode"})
                secret_name = volume["secret"]["secretName"]
                if secret_name not in self.secrets:
                    raise TranslationError(f"volume {vol_name}: Secret {secret_name} is not in the rendered Secrets")
                mode = int(volume["secret"].get("defaultMode", 0o644))
                _write_files(path, _secret_files(self.secrets[secret_name]), mode, gid, base)
            elif "configMap" in volume:
                refuse_unknown(volume["configMap"], f"volume {vol_name}.configMap", {"name"})
                cm_name = volume["configMap"]["name"]
                if cm_name not in self.configmaps:
                    raise TranslationError(f"volume {vol_name}: ConfigMap {cm_name} is not in the rendered set")
                data = {k: str(v).encode() for k, v in self.configmaps[cm_name].get("data", {}).items()}
                _write_files(path, data, 0o644, 0, base)
            elif "emptyDir" in volume:
                # on disk, 0777: medium: Memory and sizeLimit are not reproduced (module docstring)
                refuse_unknown(volume["emptyDir"] or {}, f"volume {vol_name}.emptyDir", {"medium", "sizeLimit"})
                path.mkdir()
                os.chmod(path, 0o777)
                os.chown(path, base, base)
            else:
                raise TranslationError(f"volume {vol_name}: only Secret, ConfigMap and emptyDir volumes are rendered")
            paths[vol_name] = path
        return paths

    def _env(self, env: Sequence[Doc], address: str) -> list[Doc]:
        """secretKeyRef → the value; ``$(VAR)`` of an earlier variable expanded; the Service's name → ``address``."""
        out: list[Doc] = []
        known: dict[str, str] = {}
        for var in env:
            name = str(var["name"])
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref is not None:
                secret = self.secrets.get(ref["name"])
                files = _secret_files(secret) if secret is not None else {}
                if ref["key"] not in files:
                    raise TranslationError(f"env {name}: Secret {ref['name']} has no key {ref['key']!r}")
                value = files[ref["key"]].decode()
            elif "valueFrom" in var:
                raise TranslationError(f"env {name}: only secretKeyRef is rendered, not {var['valueFrom']}")
            else:
                value = str(var.get("value", ""))
                value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: known.get(m.group(1), m.group(0)), value)
                value = value.replace(f"@{self.service_name()}:", f"@{address}:")
                value = value.replace(f"//{self.service_name()}:", f"//{address}:")
            known[name] = value
            out.append({"name": name, "value": value})
        return out

    def _boundary_arg(self, arg: str, address: str) -> str:
        prefix = f"--boundary={self.service_name()}:"
        if arg.startswith(prefix):
            return f"--boundary={address}:{arg[len(prefix) :]}"
        return arg

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
