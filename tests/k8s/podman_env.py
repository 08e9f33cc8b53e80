"""The podman world of ``make test-k8s``: a private containers.conf, the locally built image, and a run's network.

Everything a run creates carries its run id (``ostk-<id>-…``, and the sandbox names of the rendered pods). The
network's subnet is a /27 of TEST-NET-2/3 (198.51.100.0/24, 203.0.113.0/24; TEST-NET-1 may be the machine's own
network, as on the CI hosts), chosen under the lock the netns test hosts and the benchmarks take
(tests/netns_hosts.py, bench/netns.py), from the top down (they allocate from the bottom), avoiding every address
and route on the host and every other podman network; its first container starts before the lock is released,
so its bridge (and route) exists when the next one looks. Two runs, or a run and the suite, cannot collide. The
network is ``--internal`` (no route out of the machine) with DNS disabled (no aardvark: control asks
the run's own DNS container). Podman uses runc and explicit nofile/nproc ulimits (these hosts are cgroup v1,
where crun fails, and podman's default nofile exceeds the session's hard limit).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/debian-python:bookworm"  # images/build-local.sh's cached debootstrap base
AGENT_IMAGE = "localhost/debian-agent:bookworm"  # images/build-local.sh --agent-image: Debian, curl, python3, pip
POOLS = (ipaddress.IPv4Network("198.51.100.0/24"), ipaddress.IPv4Network("203.0.113.0/24"))
SLOTS = [net for pool in POOLS for net in pool.subnets(new_prefix=27)]
LOCK_PATH = "/run/lock/openshell-sandbox-test-hosts.lock"  # shared with tests/netns_hosts.py and bench/netns.py
LABEL = "openshell-sandbox-test-k8s"

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60, interval: float = 0.5) -> T:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def missing_tools() -> list[str]:
    return [tool for tool in ("podman", "runc", "netavark", "debootstrap") if shutil.which(tool) is None
            and not Path(f"/usr/lib/podman/{tool}").exists()]  # fmt: skip


def containers_conf(path: Path) -> Path:
    nofile = 65536
    hard = subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip()
    if hard.isdigit():
        nofile = min(int(hard), nofile)
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=4096:4096"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        "[network]\n"
        'network_backend = "netavark"\n'
    )
    return path


class Podman:
    """``podman`` with the run's containers.conf; every call logged to ``log`` for the run's record."""

    def __init__(self, conf: Path, log: Path) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.log = log

    def run(self, *args: str, check: bool = True, timeout: float = 180,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        result = subprocess.run(["podman", *args], capture_output=True, text=True, env=self.env, timeout=timeout,
                                input=stdin)  # fmt: skip
        with self.log.open("a") as out:
            out.write(f"$ podman {' '.join(args)}\n[rc={result.returncode}]\n{result.stdout}{result.stderr}\n")
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def exists(self, kind: str, name: str) -> bool:
        return self.run(kind, "exists", name, check=False).returncode == 0

    def inspect(self, name: str) -> dict[str, Any]:
        out: list[dict[str, Any]] = json.loads(self.run("inspect", name).stdout)
        return out[0]

    def leftovers(self, run_id: str) -> list[str]:
        """Every container, pod, network or volume whose name carries ``run_id``."""
        found = []
        for kind, fmt in (("ps", "{{.Names}}"), ("pod", "{{.Name}}"), ("network", "{{.Name}}"),
                          ("volume", "{{.Name}}")):  # fmt: skip
            args = ["ps", "-a", "--format", fmt] if kind == "ps" else [kind, "ls", "--format", fmt]
            if kind == "pod":
                args = ["pod", "ps", "--format", fmt]
            names = self.run(*args, check=False).stdout.split()
            found += [f"{kind}:{n}" for n in names if run_id in n]
        return found


class RuntimeUnavailable(Exception):
    """The machine's container runtime cannot run this run's containers: the run skips, naming why."""


class Network:
    """An internal podman network on a free /27 of TEST-NET-2/3, chosen and created under the lock; ``first``
    starts its first container (so that the bridge exists) before the lock is released."""

    def __init__(self, podman: Podman, run_id: str, first: Callable[[Network], None]) -> None:
        self.podman = podman
        self.name = f"ostk-{run_id}-net"
        os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                taken = self._taken()
                free = [slot for slot in SLOTS if not any(slot.overlaps(t) for t in taken)]
                if not free:
                    raise AssertionError(f"no free /27 in {POOLS}: in use {sorted(map(str, taken))}")
                self.subnet = free[-1]
                self.hosts = list(self.subnet.hosts())  # [0] is the bridge's
                created = podman.run("network", "create", "--internal", "--disable-dns", "--label",
                                     f"{LABEL}={run_id}", "--subnet", str(self.subnet), self.name,
                                     check=False)  # fmt: skip
                if created.returncode != 0:
                    raise RuntimeUnavailable(f"podman network create --internal exited {created.returncode}: "
                                             f"{created.stderr.strip()}")  # fmt: skip
                first(self)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _taken(self) -> list[ipaddress.IPv4Network]:
        taken = []
        addresses = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
        for match in re.finditer(r"inet (\S+)", addresses):
            taken.append(ipaddress.IPv4Interface(match.group(1)).network)
        routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
        for line in routes.splitlines():
            words = line.split()
            if words and words[0] in ("blackhole", "local", "broadcast", "unreachable", "prohibit", "throw"):
                words = words[1:]
            if words and words[0] != "default":
                with contextlib.suppress(ValueError):
                    taken.append(ipaddress.IPv4Network(words[0], strict=False))
        names = self.podman.run("network", "ls", "--format", "{{.Name}}").stdout.split()
        for name in names:
            for net in json.loads(self.podman.run("network", "inspect", name).stdout):
                for sub in net.get("subnets") or []:
                    network = ipaddress.ip_network(sub["subnet"], strict=False)
                    if isinstance(network, ipaddress.IPv4Network):
                        taken.append(network)
        return taken

    def address(self, index: int) -> str:
        return str(self.hosts[index])

    def remove(self) -> None:
        self.podman.run("network", "rm", "-f", self.name, check=False)


def new_run(parent: Path = Path("/var/tmp")) -> tuple[str, Path]:
    """A run id and the run's 0700 work directory ``ostk-<id>``: creating the directory reserves the id (under
    the test hosts' lock, and never one whose name podman still knows), so two runs never share one."""
    os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        while True:
            run_id = secrets.token_hex(3)
            work = parent / f"ostk-{run_id}"
            try:
                work.mkdir(mode=0o700)
            except FileExistsError:
                continue
            return run_id, work


def run_image(run_id: str) -> str:
    """The image this run builds and removes (two runs side by side never rebuild each other's image)."""
    return os.environ.get("OPENSHELL_K8S_IMAGE") or f"localhost/openshell-sandbox:test-k8s-{run_id}"


def _build(log: Path, *args: str) -> int:
    env = {**os.environ}
    env.pop("CONTAINERS_CONF", None)  # the script writes its own next to its cache
    with log.open("a") as out:
        result = subprocess.run(["sh", str(REPO / "images" / "build-local.sh"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, timeout=900)  # fmt: skip
    return result.returncode


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(line.strip() for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def build_base(log: Path) -> str | None:
    """The debootstrap base (cached): None, or why this machine cannot make it (its log's last lines)."""
    code = _build(log, "--base-only")
    if code == 0:
        return None
    return f"images/build-local.sh --base-only exited {code}: {_tail(log)}"


def build_image(log: Path, image: str) -> None:
    """images/build-local.sh: the base is cached, so only the first run is slow; a failure is a real failure."""
    code = _build(log, image)
    if code != 0:
        raise AssertionError(f"images/build-local.sh failed (exit {code}): {_tail(log)}; see {log}")


def build_agent_image(log: Path) -> str:
    """images/build-local.sh --agent-image: plain Debian bookworm with curl, python3 and pip (cached)."""
    code = _build(log, "--agent-image")
    if code != 0:
        raise AssertionError(f"images/build-local.sh --agent-image failed (exit {code}): {_tail(log)}; see {log}")
    return AGENT_IMAGE


WHEEL = "tinypkg-1.0-py3-none-any.whl"


def simple_index(root: Path) -> str:
    """A PEP 503 index of one minimal wheel under ``root`` (``simple/``, ``packages/``); the wheel's sha256."""
    (root / "simple" / "tinypkg").mkdir(parents=True)
    (root / "packages").mkdir()
    files = {
        "tinypkg.py": "VALUE = 1\n",
        "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = ""
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(text.encode())}\n"
    files["tinypkg-1.0.dist-info/RECORD"] = record + "tinypkg-1.0.dist-info/RECORD,,\n"
    wheel = root / "packages" / WHEEL
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (root / "simple" / "tinypkg" / "index.html").write_text(
        f'<html><body><a href="/packages/{WHEEL}#sha256={sha}">{WHEEL}</a></body></html>\n'
    )
    for path in [root, *root.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return sha


def runtime_unavailable(podman: Podman, network: str | None = None, address: str | None = None) -> str | None:
    """Whether this machine's container runtime can run a container at all (on ``network``, at ``address``):
    None, or podman's own account of why not (a nested container without cgroup access, no netavark, …). The
    probe runs the bare debootstrap base, nothing of ours, so a failure here says nothing about our pods."""
    args = ["run", "--rm", "--label", f"{LABEL}=probe"]
    args += ["--network", network, "--ip", address] if network and address else ["--network", "none"]
    try:
        result = podman.run(*args, BASE_IMAGE, "/bin/true", check=False, timeout=120)
    except subprocess.TimeoutExpired:
        return f"podman {' '.join(args)} {BASE_IMAGE} /bin/true did not finish within 120 s"
    if result.returncode == 0:
        return None
    detail = " | ".join(result.stderr.strip().splitlines()[-3:])
    return f"podman {' '.join(args)} {BASE_IMAGE} /bin/true exited {result.returncode}: {detail}"


def run_detached(podman: Podman, image: str, name: str, network: Network, address: str,
                 mounts: Sequence[tuple[Path, str, str]], argv: Sequence[str],
                 env: Mapping[str, str] | None = None) -> None:  # fmt: skip
    """A helper container (DNS, origin) on the network: the image's python as root, nothing else."""
    args = ["run", "-d", "--name", name, "--label", f"{LABEL}=1", "--network", network.name, "--ip", address,
            "--user", "0", "--entrypoint", argv[0]]  # fmt: skip
    for host, target, mode in mounts:
        args += ["-v", f"{host}:{target}:{mode}"]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    podman.run(*args, image, *argv[1:])
