"""The podman translation of ``make test-k8s`` (tests/k8s/podman_play.py, podman_run.py) without podman: what each
rendered pod becomes, and that a field the translation does not reproduce is refused, never dropped."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.k8s.render import render, to_yaml
from supervisor.k8s.spec import Model, Topology
from tests.k8s.podman_play import PlayPod, Translation, TranslationError
from tests.unit.test_k8s_render import make_spec, material_for
from tests.unit.test_k8s_render_proxy_pod import material as proxy_pod_material

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the translation chowns the pods' files (root)")

Doc = dict[str, Any]
BASE = 2147483647 + 65536 * 7


def translation(tmp_path: Path, model: Model, change: Callable[[Doc], None] | None = None, **spec: Any) -> Translation:
    """The rendered set of ``model``; ``change`` edits the workload pod's spec first (what a future render, or an
    edit by hand, might add)."""
    spec_ = make_spec(model, **spec)
    proxy_pod = spec_.topology is Topology.PROXY_POD
    rendered = render(spec_, proxy_pod_material() if proxy_pod else material_for(spec_))
    objects = list(yaml.safe_load_all(to_yaml(rendered.objects)))  # as the run reads the file render wrote
    secrets = list(yaml.safe_load_all(to_yaml(rendered.secrets)))
    if change is not None:
        (pod,) = [o for o in objects if o["kind"] == "Pod"]
        change(pod["spec"])
    tmp_path.mkdir(exist_ok=True)
    return Translation(objects, secrets, tmp_path / "pods", userns_base=BASE)


def workload_u(tmp_path: Path, change: Callable[[Doc], None] | None = None) -> PlayPod:
    return translation(tmp_path, Model.U, change).translate("workload", service_address="198.51.100.9")


def flags(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def test_model_u_workload_is_a_pod_with_a_user_namespace_and_an_unmasked_proc(tmp_path: Path) -> None:
    pod = workload_u(tmp_path)
    assert pod.run is not None
    create, init, main = pod.start("ostk-net", "198.51.100.9")
    assert create[:2] == ["pod", "create"] and flags(create, "--ip") == ["198.51.100.9"]
    assert flags(create, "--uidmap") == flags(create, "--gidmap") == [f"0:{BASE}:65536"]
    assert flags(create, "--share") == ["ipc,net,uts"]  # shareProcessNamespace: false
    assert init[:2] == ["run", "--restart"] and "-d" not in init  # to completion, before the boundary
    assert main[:2] == ["run", "-d"] and flags(main, "--restart") == ["no"]  # restartPolicy: Never
    for args in (init, main):
        assert flags(args, "--user") == ["10001:10001"] and flags(args, "--group-add") == ["10001"]
        assert flags(args, "--cap-drop") == ["ALL"] and not flags(args, "--cap-add")
        assert "no-new-privileges" in flags(args, "--security-opt")
        assert not {"-p", "--publish", "--privileged", "--userns"} & set(args)
    assert flags(main, "--security-opt") == ["no-new-privileges", "unmask=ALL"]  # procMount: Unmasked
    assert "unmask=ALL" not in flags(init, "--security-opt")  # the init container asks for no unmasked /proc
    assert "--read-only" in init and "--read-only" not in main
    assert flags(main, "--memory") == [str(2 * 2**30)] and flags(main, "--cpu-shares") == ["256"]
    container = pod.doc["spec"]["containers"][0]
    assert json.loads(flags(main, "--entrypoint")[0]) == container["command"]
    assert main[-len(container["args"]) - 1 :] == [container["image"], *container["args"]]
    secret = Path(flags(main, "-v")[0].split(":")[0])
    for path in (secret, *secret.iterdir()):
        assert path.stat().st_uid == BASE, path  # what kubelet's idmapped mounts show the pod: its own ids
    assert pod.down() == ["pod", "rm", "-f", "-t", "30", pod.name]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda s: s.update(hostNetwork=True), "hostNetwork"),
        (lambda s: s.update(hostUsers=True), "procMount 'Unmasked': kube play ignores it"),
        (lambda s: s.update(automountServiceAccountToken=True), "automountServiceAccountToken"),
        (lambda s: s["securityContext"].update(sysctls=[{"name": "net.ipv4.ip_forward", "value": "1"}]), "sysctls"),
        (lambda s: s["securityContext"].update(seLinuxOptions={"type": "spc_t"}), "seLinuxOptions"),
        (lambda s: s["containers"][0]["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
         "appArmorProfile"),
        (lambda s: s["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (lambda s: s["containers"][0]["securityContext"].update(procMount="Masked"), "procMount"),
        (lambda s: s["containers"][0]["securityContext"].update(seccompProfile={"type": "Localhost",
                                                                               "localhostProfile": "x.json"}),
         "seccompProfile"),
        (lambda s: s["containers"][0]["securityContext"].update(runAsUser=0), "runAsNonRoot"),
        (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(keep=["SYS_ADMIN"]), "keep"),
        (lambda s: s["initContainers"][0]["securityContext"].update(windowsOptions={}), "windowsOptions"),
        (lambda s: s["containers"][0].update(workingDir="/"), "workingDir"),
        (lambda s: s["containers"][0]["volumeMounts"][0].update(subPath="x"), "subPath"),
        (lambda s: s["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": 1}), "nvidia.com/gpu"),
        (lambda s: s["volumes"][0]["secret"].update(items=[{"key": "a", "path": "b"}]), "items"),
        (lambda s: s["volumes"].append({"name": "host", "hostPath": {"path": "/"}}), "hostPath"),
    ],
)  # fmt: skip
def test_a_field_the_translation_does_not_reproduce_is_refused_never_dropped(
    tmp_path: Path, change: Callable[[Doc], None], named: str
) -> None:
    with pytest.raises(TranslationError, match=re.escape(named)):
        workload_u(tmp_path, change)


def test_without_procmount_unmasked_the_boundary_gets_the_runtimes_masked_proc(tmp_path: Path) -> None:
    pod = workload_u(tmp_path, lambda s: s["containers"][0]["securityContext"].pop("procMount"))
    assert pod.run is not None and "unmask=ALL" not in pod.run.mains[0]


@pytest.mark.parametrize("model", [Model.R, Model.P])
def test_kube_played_pods_refuse_what_kube_play_ignores(tmp_path: Path, model: Model) -> None:
    spec = {"unprobed_fence": True} if model is Model.P else {}
    played = translation(tmp_path / "ok", model, **spec)
    for role in ("workload", "control"):
        pod = played.translate(role, service_address="198.51.100.9")
        assert pod.run is None and pod.start("n", "198.51.100.9")[0][:2] == ["kube", "play"]

    def unmasked(s: Doc) -> None:
        s["containers"][0]["securityContext"]["procMount"] = "Unmasked"

    def labelled(s: Doc) -> None:
        s["containers"][0]["securityContext"]["seLinuxOptions"] = {"type": "spc_t"}

    for index, change in enumerate((unmasked, labelled)):
        with pytest.raises(TranslationError):
            translation(tmp_path / str(index), model, change, **spec).translate("workload", service_address="x")


def test_the_proxy_pod_topology_still_translates(tmp_path: Path) -> None:
    played = translation(tmp_path, Model.R, topology=Topology.PROXY_POD)
    for role in ("control", "workload"):
        assert played.translate(role, service_address="198.51.100.9").run is None
