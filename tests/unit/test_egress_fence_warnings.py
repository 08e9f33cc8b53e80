"""A policy whose ``allowed_ips`` reaches into a range control's NetworkPolicy excludes is warned about — by
``policy check`` with render's ranges, and by control at start and at every reload or apply (docs/kubernetes.md
"Control's egress"): the policy allows it, the fence drops it, and only a re-render makes it reachable.

Render passes control the excluded ranges and its explicit allows (``--egress-excluded``, ``--egress-admitted``);
the rendered policy therefore loads without the warning, and a revision that adds another internal range gets it.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from supervisor.cli.main import command_parser
from supervisor.cli.policy import run_policy
from supervisor.control.policy import PolicyStore, compile_policy, load_policy_text
from supervisor.control.policy.egress_fence import EgressFence
from supervisor.k8s.spec import Model
from supervisor.protocol.exit_codes import ExitCode

from .test_k8s_render import daemon_args, main_container, one
from .test_k8s_render_knobs import POLICY_INTERNAL, objects

EXCLUDED = ("10.244.0.0/16", "fd00:10:244::/56", "10.96.0.0/12", "169.254.0.0/16", "fd00:ec2::254/128")
REGISTRY = ("10.244.7.0/24:5000",)  # what render admits for POLICY_INTERNAL
WIDER = POLICY_INTERNAL.replace(
    "    binaries:\n",
    "      - host: db.internal\n        port: 5432\n        allowed_ips: [10.96.40.0/24]\n"
    "      - host: v6.internal\n        port: 443\n        allowed_ips: ['fd00:10:244:0:1::/80']\n    binaries:\n",
)


def _fence(admitted: tuple[str, ...] = REGISTRY) -> EgressFence:
    return EgressFence.parse(EXCLUDED, admitted)


def test_an_allowed_ips_range_inside_an_excluded_one_is_warned_about_unless_rendered_to_be_admitted() -> None:
    assert _fence().warnings(load_policy_text(POLICY_INTERNAL)) == []  # render admitted it; 203.0.113.0/24 is public
    warnings = _fence().warnings(load_policy_text(WIDER), "p.yaml")
    assert [w.message.split(" ", 1)[0] for w in warnings] == ["10.96.40.0/24", "fd00:10:244:0:1::/80"]
    assert "lies in 10.96.0.0/12" in warnings[0].message and "rendered again" in warnings[0].message
    assert warnings[0].path == "network_policies.internal.endpoints[2].allowed_ips" and warnings[0].source == "p.yaml"
    # admitted on another port only: still dropped on this one
    assert len(_fence(("10.244.7.0/24:443",)).warnings(load_policy_text(POLICY_INTERNAL))) == 1
    # a range wider than the admitted block is not covered by it
    wide = POLICY_INTERNAL.replace("10.244.7.0/24", "10.244.0.0/16")
    assert len(_fence().warnings(load_policy_text(wide))) == 1
    assert EgressFence().warnings(load_policy_text(WIDER)) == []  # no ranges given: nothing known, nothing said


def test_bad_flag_values_are_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"^--egress-excluded: 'ten' is not a CIDR"):
        EgressFence.parse(["ten"], [])
    for bad in ("10.0.0.0/8", "10.0.0.0/8:x", "10.0.0.0/8:0", "10.0.0.0/8:70000"):
        with pytest.raises(ValueError, match=r"^--egress-admitted: .* is not CIDR:PORT\[,PORT\]"):
            EgressFence.parse([], [bad])
    assert EgressFence.parse([], ["fd00::/64:443,8443"]).admitted[0][1] == frozenset({443, 8443})


def test_control_warns_at_start_and_at_every_revision_that_reaches_into_the_cluster() -> None:
    store = PolicyStore(compile_policy(load_policy_text(POLICY_INTERNAL)), source="cm", egress_fence=_fence())
    assert store.snapshot().warnings == ()
    generation = store.apply_text(WIDER, "PUT /v1/policy")
    assert generation == 1
    messages = [w.message for w in store.snapshot().warnings]
    assert len(messages) == 2 and all("control's NetworkPolicy excludes" in m for m in messages)
    assert next(w["path"] for w in store.status_json()["warnings"]).endswith("endpoints[2].allowed_ips")
    # the warning never changes what is decided: the revision is in force
    assert store.current is not None and store.current.endpoint_count == 4
    started_wide = PolicyStore(compile_policy(load_policy_text(WIDER)), source="cm", egress_fence=_fence())
    assert len(started_wide.snapshot().warnings) == 2


def test_policy_check_warns_with_the_ranges_and_keeps_exit_0(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(WIDER)
    flags = [f"--egress-excluded={c}" for c in EXCLUDED] + [f"--egress-admitted={a}" for a in REGISTRY]
    out, err = io.StringIO(), io.StringIO()
    args = command_parser().parse_args(["policy", "check", str(path), *flags])
    assert run_policy(args, stdout=out, stderr=err) == 0
    assert err.getvalue().count("warning: 10.96.40.0/24 (port 5432) lies in 10.96.0.0/12") == 1, err.getvalue()
    assert out.getvalue().startswith("ok: ")
    out, err = io.StringIO(), io.StringIO()
    args = command_parser().parse_args(["policy", "check", str(path), "--egress-excluded", "nonsense"])
    assert run_policy(args, stdout=out, stderr=err) == ExitCode.USAGE
    assert "--egress-excluded: 'nonsense' is not a CIDR" in err.getvalue()


def test_render_passes_control_its_excluded_ranges_and_admitted_blocks() -> None:
    deployment = one(objects(Model.R, policy_text=POLICY_INTERNAL), "Deployment")
    parsed = daemon_args(main_container(deployment))
    assert set(parsed.egress_excluded) >= {"10.244.0.0/16", "169.254.0.0/16", "fd00:ec2::254/128"}
    assert parsed.egress_admitted == ["10.244.7.0/24:5000"]
    fence = EgressFence.parse(parsed.egress_excluded, parsed.egress_admitted)
    assert fence.warnings(load_policy_text(POLICY_INTERNAL)) == []  # what render saw loads quietly
    got = [w.message.split(" ", 1)[0] for w in fence.warnings(load_policy_text(WIDER))]
    assert got == ["10.96.40.0/24", "fd00:10:244:0:1::/80"]  # a Service range and an IPv6 pod range
