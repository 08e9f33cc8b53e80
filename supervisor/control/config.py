"""The control daemon's configuration: what its command line decided (supervisor/cli/daemon_run.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from supervisor.control.egress import Interception
from supervisor.control.inference.router import InferenceLimits
from supervisor.control.inference.routes import InferenceRoutes
from supervisor.control.local_net import LocalNetwork
from supervisor.control.policy import PolicyStore
from supervisor.control.proxy_listener import ProxyListenConfig
from supervisor.control.upstream import UpstreamConfig
from supervisor.control.workload_gone import DEFAULT_GONE_AFTER_S
from supervisor.jsonlog import JsonLog
from supervisor.protocol.attach import CaptureMode
from supervisor.protocol.certs import Bundle
from supervisor.protocol.fence_canary import REPEAT_S

EGRESS_LINKS = 2  # a few long-lived links; HTTP/2 multiplexes every captured connection over them


@dataclass
class ControlConfig:
    bundle: Bundle
    boundary_host: str
    boundary_port: int
    policy: PolicyStore
    api_path: Path
    api_listen: tuple[str, int] | None = None  # the operator API on TCP + mTLS too (--api-listen; api_tls.py)
    metrics_listen: tuple[str, int] | None = None  # /metrics for Prometheus (--metrics-listen; supervisor/metrics.py)
    agent_uid: int = 1000
    agent_gid: int = 1000
    capture_mode: CaptureMode = CaptureMode.NETNS
    acknowledge_external_fence: bool = False
    # proxy-env: control's fence canary (--fence-canary; protocol/fence_canary.py), or the acknowledgement that
    # there is none (--acknowledge-unprobed-fence); the canary round repeats every canary_interval_s
    fence_canary: tuple[str, int] | None = None
    acknowledge_unprobed_fence: bool = False
    canary_interval_s: float = REPEAT_S
    policy_file: Path | None = None  # watched for revisions (None: the policy is loaded once)
    policy_watch_reason: str = ""  # why it is watched or not, for the policy.watch event
    agent_writable: tuple[str, ...] = ()  # resolved paths the agent can write (the watch re-checks against them)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    interception: Interception | None = None
    policy_digest: str | None = None  # sha256:<hex> of the policy loaded at start (status: rendered or not)
    egress_links: int = EGRESS_LINKS  # per control process
    workers: int = 1  # control processes serving egress (--workers; control/workers), the primary included
    # control's own addresses and IPv6 egress, watched (None: not watched; tests that drive the daemon directly)
    local_net: LocalNetwork | None = None
    # the proxy-pod topology (docs/design.md "The proxy-pod topology"): control serves the workload's proxy
    # itself; no boundary is dialled. ``relaxed``: endpoint-only identity (required by proxy-pod)
    proxy: ProxyListenConfig | None = None
    relaxed_identity: bool = False
    networkpolicy_acknowledged: bool = False
    workload_gone_after_s: float = DEFAULT_GONE_AFTER_S  # --workload-gone-after: readyz and status say so
    # inference.local (--inference-routes; control/inference): the routes at start, the file watched for revisions
    # (None: not watched) and why, and the router's bounds
    inference_routes: InferenceRoutes | None = None
    inference_file: Path | None = None
    inference_watch_reason: str = ""
    inference_limits: InferenceLimits = field(default_factory=InferenceLimits)
    log: JsonLog = field(default_factory=lambda: JsonLog("control"))
