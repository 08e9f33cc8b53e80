"""The boundary daemon's configuration: what its command line decided (supervisor/cli/daemon_run.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from supervisor.boundary.forkimage.rootfs import DEFAULT_SHM_SIZE, DEFAULT_TMP_SIZE, TRUST_PATH
from supervisor.boundary.process.cgroups import DEFAULT_PIDS_LIMIT
from supervisor.boundary.process.memory_cgroup import default_memory_limit
from supervisor.jsonlog import JsonLog
from supervisor.protocol.certs import Bundle
from supervisor.protocol.privilege_model import PrivilegeModel

PROXY_PORT = 3128  # proxy-env: the HTTP proxy listener on the pod's loopback


@dataclass
class BoundaryConfig:
    bundle: Bundle
    agent_argv: tuple[str, ...]
    listen_host: str = "0.0.0.0"
    listen_port: int = 7443
    port_file: Path | None = None
    workdir: str = "/"
    agent_stdio: str = "inherit"  # "inherit" (container stdout), "pipe", or "tty" (dev mode's terminal)
    agent_tty_size: tuple[int, int] = (80, 24)  # "tty": (cols, rows) until the attached client resizes it
    agent_term: str = "xterm-256color"  # "tty": the agent's TERM (dev mode passes its caller's)
    privilege_model: PrivilegeModel = PrivilegeModel.R
    model_reason: str = ""
    hide_paths: tuple[str, ...] = ()
    exit_linger_s: float = 60.0
    acknowledge_external_fence: bool = False
    acknowledge_unprobed_fence: bool = False  # proxy-env without a canary (--acknowledge-unprobed-fence)
    tls_dir: Path = Path(TRUST_PATH)  # where we write the trust files; R and U show them at TRUST_PATH
    tmp_size: str = DEFAULT_TMP_SIZE  # the agent's private /tmp (R, U)
    shm_size: str = DEFAULT_SHM_SIZE  # the agent's private /dev/shm (R, U)
    pids_limit: int = DEFAULT_PIDS_LIMIT  # the workload's cgroup pids.max; 0: none (reported unenforced)
    memory_limit: int = field(default_factory=default_memory_limit)  # bytes; 0: none (reported unenforced)
    state_file: Path | None = None  # --state-file: our lifecycle state for the pod's readiness probe
    metrics_listen: tuple[str, int] | None = None  # /metrics for Prometheus (--metrics-listen; supervisor/metrics.py)
    test_landlock_off: bool = False  # tests only: prove the mount layer alone holds (OPENSHELL_TEST_LANDLOCK_OFF)
    log: JsonLog = field(default_factory=lambda: JsonLog("boundary"))
