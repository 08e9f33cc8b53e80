"""Real pods: the companion set ``k8s render`` writes, run under podman (``make test-k8s``).

One run: the image built from images/Containerfile on a debootstrap base (images/build-local.sh, base cached),
an internal podman network on TEST-NET-1, a DNS container and an HTTPS origin container on it (the origin's
certificate is from a CA the agent does not trust, so a request that verifies went through control's
inspection). Then, for each privilege model, a sandbox is rendered with the real CLI, translated by
tests/k8s/podman_play.py (docs/kubernetes.md, "Running the companion set under podman") and played with
``podman kube play``, except model U's workload pod, which kube play cannot give a user namespace and an unmasked
/proc: tests/k8s/podman_run.py starts it with ``podman pod create --uidmap/--gidmap`` and ``podman run``. Both
daemons run as the image's entrypoint with the rendered args. The tests are the
steps of the run, in order; pytest's verbose output lists each with its result.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from supervisor.boundary.forkimage import capabilities
from supervisor.k8s.objects import MODEL_R_CAPABILITIES, STATE_DIR, STATE_FILE
from tests import process_caps
from tests.k8s.podman_env import (
    REPO,
    WHEEL,
    Network,
    Podman,
    RuntimeUnavailable,
    build_agent_image,
    build_base,
    build_image,
    containers_conf,
    missing_tools,
    new_run,
    run_detached,
    run_image,
    runtime_unavailable,
    simple_index,
    wait_for,
)
from tests.k8s.podman_play import PlayPod, Translation, load_documents

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful podman: the run needs root"),
    pytest.mark.skipif(
        bool(missing_tools()),
        reason=f"missing {missing_tools()}: scripts/install-k8s-test-deps.sh could not install them "
        "(its message is above)",
    ),
]

CLI = [sys.executable, "-m", "supervisor.cli"]
PORT = 8443
NAMESPACE = "ostk"
ORIGIN_CA_DIR = "/etc/openshell/test-origin-ca"
POLICY = """\
version: 1
network_policies:
  origin:
    name: the test origin, inspected
    endpoints:
      - host: secure.test
        port: {port}
        allowed_ips: ["{address}/32"]
{extra}    binaries:
      - path: /usr/bin/python3*
"""
PROXY_POD_POLICY = """\
version: 1
network_policies:
  origin:
    name: the test origin and its package index, inspected
    endpoints:
      - host: secure.test
        port: {port}
        allowed_ips: ["{address}/32"]
      - host: pypi.test
        port: {port}
        allowed_ips: ["{address}/32"]
{extra}"""
SECOND_ENDPOINT = """\
      - host: denied.test
        port: {port}
        allowed_ips: ["{address}/32"]
"""
FETCH = (
    "import sys, urllib.request\n"
    "try:\n"
    "    body = urllib.request.urlopen(sys.argv[1], timeout=20).read()\n"
    "except Exception as exc:\n"
    "    print(f'FAILED {type(exc).__name__}: {exc}', file=sys.stderr); sys.exit(3)\n"
    "sys.stdout.write(body.decode())\n"
)


@dataclass
class World:
    run_id: str
    work: Path
    podman: Podman
    network: Network
    dns: str
    origin: str
    origin_ca: Path  # directory holding ca.pem, mounted into control
    requests: Path  # the origin's request log
    image: str  # built by this run from the tree (both daemons, the DNS and origin containers)
    agent_image: str  # plain Debian with curl, python3 and pip: the proxy-pod workload (nothing of ours)
    wheel_sha256: str  # of the one wheel of the origin's package index (pypi.test)

    def origin_paths(self) -> list[str]:
        if not self.requests.exists():
            return []
        return [json.loads(line)["path"] for line in self.requests.read_text().splitlines() if line.strip()]


_PODMAN_STORAGE_RACE = "/userdata/shm: device or resource busy"


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    run_id, work = new_run()
    image = run_image(run_id)
    podman = Podman(containers_conf(work / "containers.conf"), work / "podman.log")
    network: Network | None = None
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()  # netavark turns it on
    try:
        # Skipped, with the measured reason, only where the machine cannot run a container at all (before anything
        # of ours runs); from the image build on, every failure is a failure.
        unavailable = build_base(work / "build.log") or runtime_unavailable(podman)
        if unavailable:
            pytest.skip(f"this machine's container runtime cannot run pods: {unavailable}")
        build_image(work / "build.log", image)
        agent_image = build_agent_image(work / "build.log")
        files = work / "origin"
        files.mkdir(mode=0o755)
        wheel_sha256 = simple_index(files / "www")
        shutil.copy(REPO / "tests" / "https_recorder.py", files / "https_recorder.py")
        shutil.copy(REPO / "tests" / "k8s" / "dns_server.py", files / "dns_server.py")

        def start_dns(net: Network) -> None:  # under the address lock: the bridge exists once it runs
            dns, origin = net.address(1), net.address(2)
            why = runtime_unavailable(podman, net.name, dns)  # the bare base on the network first
            if why:
                raise RuntimeUnavailable(why)
            run_detached(podman, image, f"ostk-{run_id}-dns", net, dns, [(files, "/o", "ro")],
                         ["/opt/openshell-sandbox/bin/python", "/o/dns_server.py", dns,
                          f"secure.test={origin}", f"denied.test={origin}", f"pypi.test={origin}"])  # fmt: skip

        try:
            network = Network(podman, run_id, start_dns)
        except RuntimeUnavailable as exc:
            pytest.skip(f"this machine's container runtime cannot run pods on an internal network: {exc}")
        dns, origin = network.address(1), network.address(2)
        ca = trustme.CA()
        leaf = ca.issue_cert("secure.test", "denied.test", "pypi.test")
        leaf.private_key_pem.write_to_path(str(files / "key.pem"))
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(files / "cert.pem"), append=True)
        origin_ca = work / "origin-ca"
        origin_ca.mkdir(mode=0o755)
        ca.cert_pem.write_to_path(str(origin_ca / "ca.pem"))
        os.chmod(origin_ca / "ca.pem", 0o644)
        logs = work / "origin-log"
        logs.mkdir(mode=0o755)
        run_detached(podman, image, f"ostk-{run_id}-origin", network, origin,
                     [(files, "/o", "ro"), (logs, "/log", "rw")],
                     ["/usr/bin/python3", "/o/https_recorder.py", origin, str(PORT), "/o/cert.pem", "/o/key.pem",
                      "/log/requests.jsonl"], env={"RECORDER_ROOT": "/o/www"})  # fmt: skip
        probe = f"import socket; socket.create_connection(('{origin}', {PORT}), 2).close()"
        wait_for("the origin to listen", lambda: podman.run(
            "exec", f"ostk-{run_id}-origin", "/usr/bin/python3", "-c", probe, check=False).returncode == 0)  # fmt: skip
        wait_for("the DNS server", lambda: "serving" in podman.run("logs", f"ostk-{run_id}-dns").stdout)
        yield World(run_id, work, podman, network, dns, origin, origin_ca, logs / "requests.jsonl", image,
                    agent_image, wheel_sha256)  # fmt: skip
    finally:
        _teardown(podman, run_id)
        if image != os.environ.get("OPENSHELL_K8S_IMAGE"):
            podman.run("rmi", "-f", image, check=False)
        if forwarding == "0" and not podman.run("ps", "-q", check=False).stdout.strip():
            Path("/proc/sys/net/ipv4/ip_forward").write_text("0\n")
        if os.environ.get("OPENSHELL_K8S_KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)


def _teardown(podman: Podman, run_id: str) -> None:
    """Whatever a failed step left: every pod and container of this run, then the network."""
    for name in podman.run("pod", "ps", "--format", "{{.Name}}", check=False).stdout.split():
        if run_id in name:
            podman.run("pod", "rm", "-f", "-t", "5", name, check=False)
    for name in podman.run("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split():
        if run_id in name:
            podman.run("rm", "-f", "-t", "2", name, check=False)
    for name in podman.run("network", "ls", "--format", "{{.Name}}", check=False).stdout.split():
        if run_id in name:
            podman.run("network", "rm", "-f", name, check=False)


class Sandbox:
    """One rendered sandbox on the run's network: its render, its translation, its two pods."""

    def __init__(self, world: World, model: str, first_address: int, topology: str = "boundary") -> None:
        self.world = world
        self.model = model
        self.topology = topology
        proxy_pod = topology == "proxy-pod"
        self.name = f"{'pp' if proxy_pod else model.lower()}-{world.run_id}"
        self.root = world.work / self.name
        self.root.mkdir(mode=0o700)
        self.control_ip = world.network.address(first_address)
        self.workload_ip = world.network.address(first_address + 1)
        self.policy = (PROXY_POD_POLICY if proxy_pod else POLICY).format(port=PORT, address=world.origin, extra="")
        (self.root / "policy.yaml").write_text(self.policy)
        # No NetworkPolicy is enforced here (the internal network stands in for the cluster): the statement is
        # the run's, and P runs without its canary, which would rightly find no fence.
        statement = ["--networkpolicy-enforced"] if proxy_pod or model == "P" else []
        statement += ["--unprobed-fence"] if model == "P" and not proxy_pod else []
        rendered = subprocess.run(
            [*CLI, "k8s", "render", "--namespace", NAMESPACE, "--sandbox", self.name,
             "--sandbox-uid", str(uuid.uuid4()),
             "--image", pinned(world.podman, world.agent_image if proxy_pod else world.image),
             "--control-image", world.image, "--topology", topology, "--cluster-cidr", str(world.network.subnet),
             *statement,
             *([] if proxy_pod else ["--privilege-model", model]), "--policy", str(self.root / "policy.yaml"),
             "--secrets-dir", str(self.root / "secrets"), "--out", str(self.root / "objects.yaml"),
             "--", "/usr/bin/sleep", "100000"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert rendered.returncode == 0, rendered.stderr
        self.translation = Translation(
            load_documents(self.root / "objects.yaml"),
            load_documents(self.root / "secrets" / "secrets.yaml"),
            self.root / "pods",
            userns_base=2147483647 + 65536 * (1 + int(world.run_id, 16) % 30000),  # in the "containers" subid range
        )
        self.control: PlayPod | None = None
        self.workload: PlayPod | None = None

    # -- pods -------------------------------------------------------------------------------------------------
    def play_workload(self) -> PlayPod:
        # the Service selects the workload pod (the boundary's) or control's (the proxy's)
        service = self.control_ip if self.topology == "proxy-pod" else self.workload_ip
        pod = self.translation.translate("workload", service_address=service)
        self.workload = pod  # before it starts: a failed start is removed by down() too
        for args in pod.start(self.world.network.name, self.workload_ip):
            self.world.podman.run(*args)
        return pod

    def play_control(self) -> PlayPod:
        pod = self.translation.translate(
            "control", service_address=self.workload_ip,
            extra_args=[f"--dns-server={self.world.dns}:53", f"--upstream-ca={ORIGIN_CA_DIR}/ca.pem"],
            extra_mounts={ORIGIN_CA_DIR: self.world.origin_ca},
        )  # fmt: skip
        self.control = pod
        for args in pod.start(self.world.network.name, self.control_ip):
            self.world.podman.run(*args)
        return pod

    def down(self, pod: PlayPod | None, check: bool = True) -> None:
        if pod is None:
            return
        result = self.world.podman.run(*pod.down(), timeout=120, check=False)
        if result.returncode != 0 and _PODMAN_STORAGE_RACE in result.stderr:
            # Podman's own race between `rm` and conmon's cleanup unmounting the container's shm (podman issues
            # "unlinkat/EBUSY"); a second removal finishes it. What the sandbox leaves is checked afterwards.
            result = self.world.podman.run(*pod.down(), timeout=120, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(pod.down())} exited {result.returncode}: {result.stderr.strip()}")

    def down_all(self) -> None:
        """A fixture's end: whatever pods a failed step left, workload first."""
        for pod in (self.workload, self.control):
            self.down(pod, check=False)

    @property
    def control_container(self) -> str:
        assert self.control is not None
        return self.control.containers[0]

    @property
    def workload_container(self) -> str:
        assert self.workload is not None
        return self.workload.containers[0]

    # -- through podman exec into control ------------------------------------------------------------------
    def ctl(self, *args: str, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.world.podman.run("exec", "-i", self.control_container, *args, check=False, timeout=timeout,
                                     stdin=stdin)  # fmt: skip

    def status(self) -> dict[str, Any]:
        result = self.ctl("openshell-sandbox", "status", "--json")
        if result.returncode != 0:
            return {}
        out: dict[str, Any] = json.loads(result.stdout)
        return out

    def running(self) -> dict[str, Any] | None:
        status = self.status()
        return status if status.get("boundary", {}).get("state") == "running" else None

    def fetch(self, host: str, path: str) -> subprocess.CompletedProcess[str]:
        return self.ctl("openshell-sandbox", "exec", "--", "/usr/bin/python3", "-c", FETCH,
                        f"https://{host}:{PORT}{path}", timeout=90)  # fmt: skip

    def diagnose(self) -> str:
        """The last lines of every container of both pods (init containers too), for a failed step."""
        out = []
        for pod in (self.workload, self.control):
            if pod is None:
                continue
            names = self.world.podman.run("ps", "-a", "--filter", f"pod={pod.name}", "--format",
                                          "{{.Names}} {{.Status}}", check=False).stdout  # fmt: skip
            for line in names.splitlines():
                name = line.split()[0]
                logs = self.world.podman.run("logs", "--tail", "40", name, check=False)
                out.append(f"--- {line}\n{logs.stdout}{logs.stderr}")
        return "\n".join(out)

    def control_events(self) -> list[dict[str, Any]]:
        logs = self.world.podman.run("logs", self.control_container, check=False)
        return [json.loads(line) for line in (logs.stdout + logs.stderr).splitlines() if line.startswith("{")]


def pinned(podman: Podman, image: str) -> str:
    """``image`` by the digest of the local copy (render refuses a mutable reference)."""
    digest = podman.run("image", "inspect", "--format", "{{.Digest}}", image).stdout.strip()
    assert digest.startswith("sha256:"), (image, digest)
    return f"{image.rsplit(':', 1)[0]}@{digest}"


def _entrypoint_runs(world: World, container: str, mode: str) -> None:
    info = world.podman.inspect(container)
    assert info["State"]["Status"] == "running", info["State"]
    entrypoint = info["Config"].get("Entrypoint") or []
    entrypoint = entrypoint.split() if isinstance(entrypoint, str) else entrypoint  # podman 4.3: a string
    command = [*entrypoint, *(info["Config"].get("Cmd") or [])]
    assert command[0] in ("openshell-sandbox", "/usr/local/bin/openshell-sandbox"), command
    assert f"--mode={mode}" in command, command
    pid1 = world.podman.run("exec", container, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert any(p.endswith("openshell-sandbox") for p in pid1[:2]) and f"--mode={mode}" in pid1, pid1


def _up(box: Sandbox) -> None:
    box.play_workload()
    box.play_control()
    try:
        wait_for("control to attach and start the agent", box.running, timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{box.diagnose()}") from None
    _entrypoint_runs(box.world, box.workload_container, "boundary")
    _entrypoint_runs(box.world, box.control_container, "control")
    wait_for("control ready", lambda: box.ctl("openshell-sandbox", "readyz").returncode == 0, timeout=60)
    _never_restarted(box)


def _never_restarted(box: Sandbox) -> None:
    """Neither daemon's container has exited since its pod was played (podman would restart control's), and each
    init container ran once, to completion (podman 4.3 restarted them by the pod's policy; tests/k8s/podman_play.py)."""
    for pod in (box.control, box.workload):
        if pod is None:
            continue
        for container in pod.containers:
            info = box.world.podman.inspect(container)
            assert info["State"]["Status"] == "running" and info["RestartCount"] == 0, (
                f"{container}: {info['State']['Status']}, restarted {info['RestartCount']} times, state "
                f"{info['State']}\n{_unusual(box, container)}"
            )
        for container in pod.init_containers:
            info = box.world.podman.inspect(container)
            state = info["State"]
            assert state["Status"] == "exited" and state["ExitCode"] == 0 and info["RestartCount"] == 0, (
                f"init container {container}: {state['Status']} (exit {state['ExitCode']}), "
                f"restarted {info['RestartCount']} times"
            )


def _allowed_and_denied(box: Sandbox, tag: str) -> None:
    ok = box.fetch("secure.test", f"/{tag}-allowed")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["path"] == f"/{tag}-allowed"
    denied = box.fetch("denied.test", f"/{tag}-denied")
    assert denied.returncode != 0, denied.stdout
    assert f"/{tag}-allowed" in box.world.origin_paths()
    assert f"/{tag}-denied" not in box.world.origin_paths(), "a denied request reached the origin"
    wait_for("the refusal in control's log", lambda: [
        e for e in box.control_events() if e.get("event") == "egress" and e.get("decision") == "deny"
        and "denied.test" in json.dumps(e)])  # fmt: skip


# ---- model R: every step ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def box_r(world: World) -> Iterator[Sandbox]:
    box = Sandbox(world, "R", 3)
    yield box
    box.down_all()


def test_r_1_both_daemons_run_as_entrypoints_from_the_rendered_pods(box_r: Sandbox) -> None:
    _up(box_r)
    _control_on_every_core(box_r)


def _control_on_every_core(box: Sandbox) -> None:
    """Rendered control runs --workers=auto: a process per CPU here (no CPU limit is rendered; the memory limit
    allows eight), each with its egress links (boundary topology) or its share of the proxy port."""
    cpus = len(os.sched_getaffinity(0))
    expected = min(cpus, 8)
    workers = box.status().get("workers")
    if expected == 1:
        assert workers is None, workers
        return
    assert isinstance(workers, list) and len(workers) == expected - 1, workers
    (started,) = [e for e in box.control_events() if e.get("event") == "control.workers"]
    assert started["workers"] == expected and len(started["pids"]) == expected, started


def test_r_2_allowed_https_verifies_through_inspection_and_a_denied_one_is_refused(box_r: Sandbox) -> None:
    _allowed_and_denied(box_r, "r")


def test_r_2b_the_workload_probe_reads_the_boundarys_state_which_the_agent_cannot_touch(box_r: Sandbox) -> None:
    podman = box_r.world.podman
    probe = ["openshell-sandbox", "boundary-ready", STATE_FILE]  # what the rendered readinessProbe runs
    ready = podman.run("exec", box_r.workload_container, *probe, check=False)
    assert ready.returncode == 0 and ready.stdout.strip() == "boundary: running", ready.stdout + ready.stderr
    # The agent tries to see and to spoof it (as it would to claim readiness after its fence was lost).
    spoof = f"ls -A {STATE_DIR}; echo ended > {STATE_FILE} && echo WROTE; rm {STATE_FILE} && echo RM"
    tried = box_r.ctl("openshell-sandbox", "exec", "--", "/bin/sh", "-c", spoof)
    assert tried.stdout.split()[:1] == ["tls"], tried.stdout  # "state" would sort first: not in its root
    again = podman.run("exec", box_r.workload_container, "cat", STATE_FILE, check=False)
    assert again.stdout == "running\n", again.stdout + again.stderr + tried.stdout + tried.stderr  # the real one


def test_r_3_podman_exec_into_control_status_exec_id_policy_apply(box_r: Sandbox) -> None:
    status = box_r.ctl("openshell-sandbox", "status")
    assert status.returncode == 0 and box_r.name in status.stdout, status.stdout + status.stderr
    ident = box_r.ctl("openshell-sandbox", "exec", "--", "/usr/bin/id")
    assert ident.returncode == 0 and ident.stdout.startswith("uid=1000(agent)"), ident.stdout + ident.stderr
    _policy_apply(box_r, "r")


def _policy_apply(box: Sandbox, tag: str) -> None:
    """``policy apply`` through control's container: generation + 1, and the denied host becomes allowed."""
    before = box.status()["policy"]
    world = box.world
    second = SECOND_ENDPOINT.format(port=PORT, address=world.origin)
    wider = POLICY.format(port=PORT, address=world.origin, extra=second)
    # control's root is read-only: the file comes in on stdin (kubectl exec -i … policy apply /dev/stdin < FILE)
    applied = box.ctl("openshell-sandbox", "policy", "apply", "/dev/stdin", stdin=wider)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    after = box.status()["policy"]
    assert after != before and after.get("generation") == before.get("generation", 1) + 1, (before, after)
    now = box.fetch("denied.test", f"/{tag}-after-apply")
    assert now.returncode == 0 and json.loads(now.stdout)["path"] == f"/{tag}-after-apply", now.stdout + now.stderr


# Every operation after the drop, from control's container as an operator would (one shell run: a forward and a
# signal need a process in the background): PTY, signal, terminate (--timeout's), forward into the workload.
OPERATIONS = r"""
set -e
osb=openshell-sandbox
[ "$($osb exec -t -- /bin/sh -c 'stty size')" != "" ]
$osb exec -- /usr/bin/sleep 300 &
sleeper=$!
handle=""
running='import json, sys
print(" ".join(p["handle"] for p in json.load(sys.stdin)["boundary"]["processes"]
               if p["kind"] == "exec" and p["state"] == "running"))'
for i in $(seq 1 100); do
  handle=$($osb status --json | python3 -c "$running")
  [ -n "$handle" ] && break
  sleep 0.2
done
$osb signal TERM $handle
code=0; wait $sleeper || code=$?
[ "$code" = 143 ] || { echo "signalled exec exited $code"; exit 1; }
code=0; $osb exec --timeout 1 -- /bin/sh -c "trap '' TERM; sleep 300" || code=$?
[ "$code" = 124 ] || { echo "terminated exec exited $code"; exit 1; }
$osb exec -- /usr/bin/python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &
server=$!
listening='import socket; socket.create_connection(("127.0.0.1", 8000), timeout=5).close()'
for i in $(seq 1 100); do  # forward checks its target once at start: the server must listen by then
  $osb exec -- /usr/bin/python3 -c "$listening" 2>/dev/null && break
  sleep 0.3
done
$osb forward 18000:8000 >&2 &
forward=$!
fetch='import urllib.request; urllib.request.urlopen("http://127.0.0.1:18000/", timeout=5)'
for i in $(seq 1 100); do
  python3 -c "$fetch" 2>/dev/null && { echo forwarded; break; }
  sleep 0.3
done
kill $server $forward 2>/dev/null || true
"""


def _capabilities_after_ready(box: Sandbox) -> None:
    """``podman exec`` into the boundary's container: every task of its processes has its role's sets."""
    held = capabilities.mask(tuple(MODEL_R_CAPABILITIES))

    def read() -> process_caps.Census:
        done = box.world.podman.run("exec", box.workload_container, "/usr/bin/python3", "-c", process_caps.CENSUS,
                                    check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return process_caps.parse(done.stdout)

    process_caps.check(read, 1, held)  # the boundary is the container's PID 1


def test_r_3b_boundary_processes_keep_only_their_capabilities_and_every_operation_works(box_r: Sandbox) -> None:
    _capabilities_after_ready(box_r)
    done = box_r.ctl("/bin/sh", "-c", OPERATIONS, timeout=180)
    assert done.returncode == 0 and "forwarded" in done.stdout, done.stdout + done.stderr + box_r.diagnose()
    _capabilities_after_ready(box_r)


def test_r_4_control_pod_replaced_resumes_the_same_agent_with_the_same_ca(box_r: Sandbox) -> None:
    _control_replaced(box_r, "r")


def _control_replaced(box_r: Sandbox, tag: str) -> None:
    """Control's pod replaced as its Deployment would: the same agent and boundary instance resume, same CA."""
    before = box_r.status()
    ca, agent = before["interception"]["ca_sha256"], before["boundary"]["agent"]["handle"]
    instance = before["boundary"]["boundary_instance"]
    assert ca and before["interception"]["match"] is True
    box_r.down(box_r.control)
    box_r.play_control()  # what the Deployment does: a new pod, fresh emptyDirs, the same Secrets
    wait_for("lifecycle.resumed", lambda: any(e.get("event") == "lifecycle.resumed" for e in box_r.control_events()),
             timeout=120)  # fmt: skip
    after = wait_for("running after the restart", box_r.running, timeout=60)
    assert after["interception"] == {"ca_sha256": ca, "boundary_ca_sha256": ca, "match": True}
    assert after["boundary"]["agent"]["handle"] == agent, (before["boundary"], after["boundary"])
    assert after["boundary"]["boundary_instance"] == instance
    wait_for("ready after the restart", lambda: box_r.ctl("openshell-sandbox", "readyz").returncode == 0)
    again = box_r.fetch("secure.test", f"/{tag}-after-restart")
    assert again.returncode == 0, f"{again.stderr}\n{box_r.diagnose()}"
    assert json.loads(again.stdout)["path"] == f"/{tag}-after-restart"
    _never_restarted(box_r)


# The agent's namespace gains an address on lo (what code with CAP_NET_ADMIN there would do): the launcher, which
# kept only NET_ADMIN, still re-reads the fence and the workload ends.
FENCE_CHANGE = r"""
import ctypes, sys
from pyroute2 import IPRoute
ns = open(f"/proc/{sys.argv[1]}/ns/net")
if ctypes.CDLL(None, use_errno=True).setns(ns.fileno(), 0x40000000) != 0:
    raise OSError(ctypes.get_errno(), "setns")
IPRoute().addr("add", index=1, address="192.0.2.77", prefixlen=32)
"""


def test_r_4b_after_resume_still_narrowed_and_a_fence_change_ends_the_workload(box_r: Sandbox) -> None:
    _capabilities_after_ready(box_r)
    launcher = box_r.world.podman.run("exec", box_r.workload_container, "cat", "/proc/1/task/1/children").stdout.split()
    assert len(launcher) == 1, launcher
    changed = box_r.world.podman.run("exec", box_r.workload_container, "/opt/openshell-sandbox/bin/python3", "-c",
                                     FENCE_CHANGE,
                                     launcher[0], check=False)  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    wait_for("control to log enforcement-lost",
             lambda: any(e.get("event") == "enforcement-lost" for e in box_r.control_events()), timeout=60)  # fmt: skip


def test_r_5_workload_removed_control_stays_up_not_ready_logging(box_r: Sandbox) -> None:
    podman = box_r.world.podman
    box_r.down(box_r.workload)
    box_r.workload = None

    def failures() -> int:
        return sum(1 for e in box_r.control_events() if e.get("event", "").startswith("link.") and
                   e.get("event") != "link.up")  # fmt: skip

    seen = failures()
    wait_for("control to log the lost link, repeatedly", lambda: failures() >= seen + 3, timeout=120)
    info = podman.inspect(box_r.control_container)
    assert info["State"]["Status"] == "running" and info["RestartCount"] == 0, (
        f"{info['State']['Status']}, restarted {info['RestartCount']} times, state {info['State']}\n{_unusual(box_r)}"
    )
    ready = box_r.ctl("openshell-sandbox", "readyz")
    assert ready.returncode != 0 and "boundary" in ready.stdout + ready.stderr, ready.stdout + ready.stderr


def _unusual(box: Sandbox, container: str | None = None) -> str:
    """A daemon's (control's) whole log without the routine lines: what a restart left behind (tracebacks, exits)."""
    logs = box.world.podman.run("logs", container or box.control_container, check=False)
    routine = ('"event":"link.failed"', '"event":"dns"', '"event":"egress"', '"event":"link.up"')
    return "\n".join(line[:400] for line in (logs.stdout + logs.stderr).splitlines()
                     if not any(r in line for r in routine))  # fmt: skip


def test_r_6_kube_down_leaves_nothing_of_the_sandbox(box_r: Sandbox) -> None:
    box_r.down(box_r.control)
    box_r.control = None
    assert not [x for x in box_r.world.podman.leftovers(box_r.name)]


# ---- model P ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def box_p(world: World) -> Iterator[Sandbox]:
    box = Sandbox(world, "P", 5)
    yield box
    box.down_all()


def test_p_1_pods_up_allowed_and_denied(box_p: Sandbox) -> None:
    _up(box_p)
    ident = box_p.ctl("openshell-sandbox", "exec", "--", "/usr/bin/id", "-u")
    assert ident.returncode == 0 and ident.stdout.strip() != "0", ident.stdout + ident.stderr
    _allowed_and_denied(box_p, "p")


def test_p_2_kube_down_leaves_nothing_of_the_sandbox(box_p: Sandbox) -> None:
    box_p.down(box_p.control)
    box_p.down(box_p.workload)
    box_p.control = box_p.workload = None
    assert not box_p.world.podman.leftovers(box_p.name)


# ---- model U: the workload pod with its own user namespace and an unmasked /proc (podman pod create + run) -------
@pytest.fixture(scope="module")
def box_u(world: World) -> Iterator[Sandbox]:
    box = Sandbox(world, "U", 7)
    yield box
    box.down_all()


def _boundary_ids(box: Sandbox) -> dict[str, str]:
    """The boundary's /proc status lines and uid_map, read inside the workload container (podman exec joins its
    user namespace) and from the host (the kernel's view of the same process)."""
    podman = box.world.podman
    script = "cat /proc/self/uid_map /proc/1/uid_map; grep -E '^(Uid|Cap[A-Za-z]+):' /proc/1/status"
    inside = podman.run("exec", box.workload_container, "/bin/sh", "-c", script)
    host_pid = podman.inspect(box.workload_container)["State"]["Pid"]
    host = Path(f"/proc/{host_pid}/status").read_text()
    return {"inside": inside.stdout, "host": host}


def test_u_1_pods_up_the_boundary_in_a_user_namespace_with_no_capability(box_u: Sandbox) -> None:
    _up(box_u)
    assert box_u.workload is not None and box_u.workload.run is not None, "model U's pod was not started by podman_run"
    ids = _boundary_ids(box_u)
    base = box_u.translation.userns_base
    maps = [line.split() for line in ids["inside"].splitlines() if len(line.split()) == 3]
    assert maps == [["0", str(base), "65536"]] * 2, ids["inside"]  # not the identity map "0 0 4294967295"
    inside = dict(line.split(":", 1) for line in ids["inside"].splitlines() if ":" in line)
    assert inside["Uid"].split()[0] == "10001", inside
    for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
        assert int(inside[key], 16) == 0, (key, inside)
    host = dict(line.split(":", 1) for line in ids["host"].splitlines() if ":" in line)
    assert host["Uid"].split()[0] == str(base + 10001) and int(host["CapEff"], 16) == 0, host
    ready = box_u.world.podman.run("exec", box_u.workload_container, "openshell-sandbox", "boundary-ready", STATE_FILE,
                                   check=False)  # fmt: skip
    assert ready.returncode == 0 and ready.stdout.strip() == "boundary: running", ready.stdout + ready.stderr
    assert box_u.status()["boundary"]["privilege_model"] == "U", box_u.status()["boundary"]


def test_u_2_allowed_https_verifies_through_inspection_and_a_denied_one_is_refused(box_u: Sandbox) -> None:
    _allowed_and_denied(box_u, "u")


def test_u_3_podman_exec_into_control_status_exec_id_policy_apply(box_u: Sandbox) -> None:
    status = box_u.ctl("openshell-sandbox", "status")
    assert status.returncode == 0 and box_u.name in status.stdout and "model U" in status.stdout, status.stdout
    ident = box_u.ctl("openshell-sandbox", "exec", "--", "/usr/bin/id", "-u")  # the boundary's uid, mapped to itself
    assert ident.returncode == 0 and ident.stdout.strip() == "10001", ident.stdout + ident.stderr
    _policy_apply(box_u, "u")


def test_u_4_control_pod_replaced_resumes_the_same_agent_with_the_same_ca(box_u: Sandbox) -> None:
    _control_replaced(box_u, "u")


def test_u_5_removing_both_pods_leaves_nothing_of_the_sandbox(box_u: Sandbox) -> None:
    box_u.down(box_u.control)
    box_u.down(box_u.workload)
    box_u.control = box_u.workload = None
    assert not box_u.world.podman.leftovers(box_u.name)


# ---- the proxy-pod topology: the workload is plain Debian (curl, python3, pip), control serves its proxy ----------
@pytest.fixture(scope="module")
def box_pp(world: World) -> Iterator[Sandbox]:
    box = Sandbox(world, "R", 9, topology="proxy-pod")
    yield box
    box.down_all()


def _agent(box: Sandbox, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` in the workload's container, with the environment the rendered pod gives the agent."""
    return box.world.podman.run("exec", box.workload_container, "/bin/sh", "-c", script, check=False,
                                timeout=timeout)  # fmt: skip


def test_x_1_proxy_pod_control_serves_and_the_workload_runs_nothing_of_ours(box_pp: Sandbox) -> None:
    box_pp.play_control()  # first: the workload's proxy variables name control's address (the Service's)
    try:
        wait_for("control ready", lambda: box_pp.ctl("openshell-sandbox", "readyz").returncode == 0, timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{box_pp.diagnose()}") from None
    box_pp.play_workload()
    wait_for("the workload's agent to run", lambda: box_pp.world.podman.inspect(box_pp.workload_container)[
        "State"]["Status"] == "running")  # fmt: skip
    _never_restarted(box_pp)
    topology = box_pp.status()["topology"]
    assert topology["name"] == "proxy-pod" and topology["identity"] == "relaxed", topology
    assert topology["networkpolicy_enforcement"] == "acknowledged", topology
    ours = _agent(
        box_pp, "id -u; command -v openshell-sandbox; ls /opt/openshell-sandbox; command -v curl; command -v python3"
    )
    lines = ours.stdout.split()
    assert lines[0] == "1000" and "/usr/bin/curl" in lines and "/usr/bin/python3" in lines, ours.stdout + ours.stderr
    assert not [line for line in lines if "openshell" in line], f"the workload image holds ours: {ours.stdout}"
    _entrypoint_runs(box_pp.world, box_pp.control_container, "control")
    _control_on_every_core(box_pp)


def test_x_2_curl_https_and_pip_download_through_control(box_pp: Sandbox) -> None:
    world = box_pp.world
    curl = _agent(box_pp, f"curl -sS --fail https://secure.test:{PORT}/x-allowed")
    assert curl.returncode == 0 and json.loads(curl.stdout)["path"] == "/x-allowed", curl.stdout + curl.stderr
    pip = _agent(box_pp, f"cd /sandbox && python3 -m pip download --no-cache-dir --disable-pip-version-check "
                 f"--no-deps --only-binary=:all: --index-url https://pypi.test:{PORT}/simple/ -d dl tinypkg==1.0 "
                 f"&& sha256sum dl/{WHEEL}")  # fmt: skip
    assert pip.returncode == 0 and world.wheel_sha256 in pip.stdout, pip.stdout + pip.stderr
    assert "/simple/tinypkg/" in world.origin_paths() and f"/packages/{WHEEL}" in world.origin_paths()
    allowed = [e for e in box_pp.control_events() if e.get("event") == "egress" and e.get("decision") == "allow"]
    assert {f"secure.test:{PORT}", f"pypi.test:{PORT}"} <= {e.get("destination") for e in allowed}, allowed[-3:]
    assert all(e.get("identity") == "relaxed" for e in allowed), allowed[-3:]


def test_x_3_a_denied_host_is_refused_and_never_reached(box_pp: Sandbox) -> None:
    denied = _agent(box_pp, f"curl -sS -o /dev/null -w '%{{http_connect}}' https://denied.test:{PORT}/x-denied")
    assert denied.returncode != 0 and denied.stdout.strip() == "403", denied.stdout + denied.stderr
    assert "/x-denied" not in box_pp.world.origin_paths(), "a denied request reached the origin"
    wait_for("the refusal in control's log", lambda: [
        e for e in box_pp.control_events() if e.get("event") == "egress" and e.get("decision") == "deny"
        and "denied.test" in json.dumps(e)])  # fmt: skip


def test_x_4_a_client_without_the_token_gets_407(box_pp: Sandbox) -> None:
    proxy = f"{box_pp.control_ip}:3128"
    for label, url in (("none", f"http://{proxy}"), ("wrong", f"http://sandbox:not-the-token@{proxy}")):
        tunnel = _agent(box_pp, f"curl -sS -o /dev/null -w '%{{http_connect}}' --proxy {url} "
                        f"https://secure.test:{PORT}/x-{label}-token")  # fmt: skip
        assert tunnel.returncode != 0 and tunnel.stdout.strip() == "407", (label, tunnel.stdout + tunnel.stderr)
        plain = _agent(box_pp, f"curl -sS -o /dev/null -w '%{{http_code}}' --proxy {url} "
                       f"http://secure.test:{PORT}/x-{label}-token-plain")  # fmt: skip
        assert plain.stdout.strip() == "407", (label, plain.stdout + plain.stderr)
    paths = box_pp.world.origin_paths()
    assert not [p for p in paths if "-token" in p], f"a request without the token reached the origin: {paths}"
    wait_for("four proxy.refused lines in control's log", lambda: len([
        e for e in box_pp.control_events() if e.get("event") == "proxy.refused"]) >= 4)  # fmt: skip
    _never_restarted(box_pp)


def test_x_5_kube_down_leaves_nothing_of_the_sandbox(box_pp: Sandbox) -> None:
    box_pp.down(box_pp.workload)
    box_pp.down(box_pp.control)
    box_pp.control = box_pp.workload = None
    assert not box_pp.world.podman.leftovers(box_pp.name)


# ---- the end of the run ------------------------------------------------------------------------------------------
def test_z_teardown_leaves_nothing(world: World) -> None:
    _teardown(world.podman, world.run_id)
    assert not world.podman.leftovers(world.run_id)
    subnet = world.network.subnet
    addresses = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    left = [w for w in (addresses + routes).split() if "." in w and w[0].isdigit() and _in(w, subnet)]
    assert not left, f"{subnet} is still on the host: {left}"


def _in(word: str, subnet: ipaddress.IPv4Network) -> bool:
    try:
        return ipaddress.ip_interface(word).ip in subnet
    except ValueError:
        return False
