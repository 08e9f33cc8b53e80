"""The workload pod's readiness probe reads the boundary's own state, locally (docs/kubernetes.md "Readiness and
liveness"): the boundary publishes every lifecycle state to ``--state-file``, ``boundary-ready`` passes only for
ready and running, and render puts the file where only the boundary writes and probes it with our entrypoint."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stdout
from pathlib import Path

from supervisor.boundary import state_file
from supervisor.cli.main import run_command
from supervisor.k8s.objects import STATE_DIR, STATE_FILE, TLS_DIR
from supervisor.k8s.spec import Model
from supervisor.protocol.lifecycle import Lifecycle, Op, State

from .test_k8s_render import daemon_args, main_container, mount_path, one
from .test_k8s_render_knobs import objects


def _probe(path: Path) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = run_command(["boundary-ready", str(path)])
    return code, out.getvalue().strip()


def test_every_transition_is_published_and_only_ready_and_running_pass_the_probe(tmp_path: Path) -> None:
    path = tmp_path / "state"
    assert _probe(path) == (1, "boundary: no state")  # nothing written yet: not ready
    seen: list[str] = []

    def publish(state: State) -> None:
        assert state_file.publish(path, str(state))
        seen.append(_probe(path)[1])
        assert (_probe(path)[0] == 0) is (state in (State.READY, State.RUNNING))

    life = Lifecycle(on_change=publish)
    for op in (Op.ATTACH, Op.CONFIRM, Op.START):
        life.advance(op)
    life.end()
    assert seen == ["boundary: bound", "boundary: ready", "boundary: running", "boundary: ended"]
    assert os.stat(path).st_mode & 0o777 == 0o644 and not list(tmp_path.glob(".*.tmp"))
    assert _probe(path)[0] == 1  # ended: never ready again


def test_a_state_file_that_cannot_be_written_leaves_the_probe_failing(tmp_path: Path) -> None:
    assert not state_file.publish(tmp_path / "missing-dir" / "state", "ready")
    assert _probe(tmp_path / "missing-dir" / "state")[0] == 1
    (tmp_path / "state").write_text("readyish\n")
    assert _probe(tmp_path / "state") == (1, "boundary: readyish")


def test_render_probes_the_boundarys_state_file_in_its_own_volume() -> None:
    for model in (Model.R, Model.U, Model.P):
        pod = one(objects(model), "Pod", "os-wl-")
        container = main_container(pod)
        assert daemon_args(container).state_file == Path(STATE_FILE)
        probe = container["readinessProbe"]["exec"]["command"]
        assert probe == [container["command"][0], "boundary-ready", STATE_FILE]
        # in the boundary's own emptyDir, outside the trust files' directory the agent sees (R, U)
        assert mount_path(container, "boundary-state") == STATE_DIR
        assert not STATE_FILE.startswith(TLS_DIR + "/")
