"""The agent's mount layout as planned on the host's view (rootfs.plan_root) and its Landlock rules
(confinement.landlock_for): pure logic, against a fake host tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.boundary.confinement import landlock_for, root_for
from supervisor.boundary.forkimage.rootfs import TRUST_PATH, Bind, RootError, RootPlan, check_size, plan_root
from supervisor.protocol.attach import StaticPolicy


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """/usr with bin and lib, /bin -> usr/bin, /lib -> usr/lib, /etc, /opt, a home, /run, /tmp, a state dir."""
    for d in ("usr/bin", "usr/lib", "etc", "opt", "home/op", "run/systemd/resolve", "tmp/x", "var/lib/svc",
              "state/tls", "work", "proc", "dev"):  # fmt: skip
        (tmp_path / d).mkdir(parents=True)
    os.symlink("usr/bin", tmp_path / "bin")
    os.symlink("usr/lib", tmp_path / "lib")
    (tmp_path / "run/systemd/resolve/stub-resolv.conf").write_text("nameserver 127.0.0.53\n")
    (tmp_path / "etc/policy.yaml").write_text("version: 1\n")
    return tmp_path


def plan(host: Path, **kw: object) -> RootPlan:
    args: dict[str, object] = {"workdir": "/work", "trust_dir": "/state/tls", "agent_uid": 61000,
                               "agent_gid": 61000, "host_root": str(host)}  # fmt: skip
    args.update(kw)
    return plan_root(**args)  # type: ignore[arg-type]


def targets(p: RootPlan) -> dict[str, bool]:
    return {b.target: b.writable for b in p.binds}


def test_default_layout_reads_system_trees_writes_only_the_workdir(host: Path) -> None:
    p = plan(host)
    assert targets(p) == {"/etc": False, "/opt": False, "/usr": False, "/work": True, TRUST_PATH: False}
    assert ("/bin", "usr/bin") in p.symlinks and ("/lib", "usr/lib") in p.symlinks  # symlinks kept, not bound
    assert not any(b.target in ("/lib32", "/lib64", "/sbin") for b in p.binds)  # absent ones skipped
    assert Bind("/state/tls", TRUST_PATH, False, True) in p.binds
    assert (p.tmp_size, p.shm_size) == ("256m", "64m")


def test_homes_var_lib_host_run_and_tmp_are_absent(host: Path) -> None:
    p = plan(host)
    for path in ("/home", "/home/op", "/var", "/var/lib/svc", "/run", "/tmp", "/proc", "/dev"):
        assert path not in targets(p)


def test_binds_are_ordered_parents_first(host: Path) -> None:
    (host / "work/sub").mkdir()
    p = plan(host, read_write=["/usr/lib"], read_only=["/work/sub"])
    order = [b.target for b in p.binds]
    assert order.index("/usr") < order.index("/usr/lib") and order.index("/work") < order.index("/work/sub")
    assert targets(p)["/usr/lib"] is True and targets(p)["/work/sub"] is False


@pytest.mark.parametrize("workdir", ["/", "//", "/.", "relative"])
def test_workdir_of_root_is_refused(host: Path, workdir: str) -> None:
    with pytest.raises(RootError, match="workdir"):
        plan(host, workdir=workdir)


def test_workdir_symlink_to_root_is_refused(host: Path) -> None:
    os.symlink("/", host / "up")
    with pytest.raises(RootError, match="workdir"):
        plan(host, workdir="/up")


def test_read_write_root_is_refused(host: Path) -> None:
    with pytest.raises(RootError, match="read_write"):
        plan(host, read_write=["/"])


def test_policy_paths_in_synthetic_trees_get_the_private_ones(host: Path) -> None:
    p = plan(host, read_write=["/tmp", "/run", "/dev/shm", "/proc", "/proc/1/mem", "/dev"], read_only=["/tmp/x"])
    assert set(targets(p)) == {"/etc", "/opt", "/usr", "/work", TRUST_PATH, "/tmp/x"}
    assert targets(p)["/tmp/x"] is False  # named below /tmp: bound from the host, as asked


def test_read_only_root_grants_every_top_level_tree_but_the_synthetic(host: Path) -> None:
    p = plan(host, read_only=["/"])
    assert {"/home", "/var", "/state"} <= set(targets(p))
    assert not {"/proc", "/dev", "/tmp", "/run"} & set(targets(p))
    assert not any(w for t, w in targets(p).items() if t != "/work")


def test_resolved_style_resolv_conf_target_is_bound_read_only(host: Path) -> None:
    os.symlink("../run/systemd/resolve/stub-resolv.conf", host / "etc/resolv.conf")
    p = plan(host)
    assert Bind("/run/systemd/resolve/stub-resolv.conf", "/run/systemd/resolve/stub-resolv.conf", False, False) in (
        p.binds
    )
    assert [b.target for b in p.binds].index("/run/systemd/resolve/stub-resolv.conf") > 0


def test_plain_resolv_conf_needs_nothing_from_run(host: Path) -> None:
    (host / "etc/resolv.conf").write_text("nameserver 10.0.0.1\n")
    assert not any(b.target.startswith("/run/systemd") for b in plan(host).binds)


def test_hidden_paths_are_resolved_and_absent_ones_dropped(host: Path) -> None:
    os.symlink("policy.yaml", host / "etc/policy-link")
    p = plan(host, hide=["/etc/policy-link", "/state/nothing-here", "/etc/policy.yaml"])
    assert p.hide == ("/etc/policy.yaml",)


def test_hiding_the_workdir_or_a_directory_above_it_is_refused(host: Path) -> None:
    with pytest.raises(RootError, match="hide-path: /work holds the workdir"):
        plan(host, hide=["/work"])
    assert plan(host, hide=["/"]).hide == ()  # "/" is never hidden: nothing would be left


def test_missing_trust_dir_is_refused_naming_it(host: Path) -> None:
    with pytest.raises(RootError, match="/state/none"):
        plan(host, trust_dir="/state/none")


def test_wire_round_trip_and_size_checks(host: Path) -> None:
    p = plan(host, tmp_size="1G", shm_size="8m")
    assert RootPlan.from_wire(p.to_wire()) == p and p.tmp_size == "1g"
    for bad in ("0", "-1", "12x", "", "1 m"):
        with pytest.raises(RootError):
            check_size(bad, "--tmp-size")


def test_landlock_default_is_the_safe_set_never_root_writable() -> None:
    for model in ("R", "U", "P"):
        spec = landlock_for(StaticPolicy(), "/work", model=model, agent_uid=61000)
        assert "/" not in spec.read_write and "/work" in spec.read_write and "/tmp" in spec.read_write
        assert not any(p == "/proc" or p.startswith("/proc/") for p in spec.read_write)
        assert {"/usr", "/etc", "/proc", TRUST_PATH} <= set(spec.read_only)
        assert {"/dev/null", "/dev/pts", "/dev/shm"} <= set(spec.read_write) and "/dev" not in spec.read_write
    assert "/" not in landlock_for(StaticPolicy(), "/work", model="P").read_only  # P has no private root to list
    assert "/run/user/61000" not in landlock_for(StaticPolicy(), "/work", model="P", agent_uid=61000).read_write


def test_landlock_never_grants_write_under_proc_even_if_a_policy_asks() -> None:
    policy = StaticPolicy.from_wire(
        {"filesystem_policy": {"read_write": ["/proc", "/proc/1/mem", "/", "/data"], "read_only": ["/usr"]}}
    )
    spec = landlock_for(policy, "/work")
    assert spec.read_write[:1] == ("/data",) and "/work" not in spec.read_write
    assert {"/proc", "/proc/1/mem", "/"} <= set(spec.read_only)


def test_p_reads_the_trust_files_where_the_boundary_wrote_them() -> None:
    policy = StaticPolicy.from_wire({"filesystem_policy": {"read_only": ["/usr"]}})
    spec = landlock_for(policy, "/w", model="P", trust_dir="/var/tls")
    assert "/var/tls" in spec.read_only


def test_workdir_left_out_by_the_policy_is_mounted_read_only(host: Path) -> None:
    policy = StaticPolicy.from_wire(
        {"filesystem_policy": {"include_workdir": False, "read_only": ["/usr"], "read_write": ["/proc"]}}
    )
    p = root_for(policy, str(host / "work"), trust_dir=str(host / "state/tls"), agent_uid=1, agent_gid=1,
                 hide=(), tmp_size="1m", shm_size="1m")  # fmt: skip
    assert targets(p)[str((host / "work").resolve())] is False
    assert not any(t.startswith("/proc") for t in targets(p))
