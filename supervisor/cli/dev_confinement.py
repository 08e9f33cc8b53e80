"""What dev mode sets up so the agent never touches its policy or control's secrets (docs/design.md "Settled
details": "The agent never touches its policy or control's secrets", "Model U under euid 0", "Default
filesystem").

Rules:

1. Control works from private copies: ``--policy``, ``--credentials`` and ``--inference-routes`` are copied into
   ``private/`` (0700) of dev's temporary directory, and control loads the copies. The original policy (and
   routes file) is only *watched* for revisions, and only when ``supervisor/control/policy/watch_safety.py``
   finds that the agent cannot change it; otherwise it is loaded once and dev says so (``policy apply`` still works).
2. What the agent must not see is passed to the boundary's ``--hide-path`` (file-granular): the operator API's
   runtime directory, dev's temporary directory (``private/``, control's bundle, the interception CA), the
   events file, and the originals of ``--policy``, ``--credentials`` and ``--inference-routes`` (models R and U;
   model P has no mount namespace). Most are absent from the agent's root already; hiding them too costs nothing
   and keeps them hidden if a policy grants a tree that holds them.
3. Model P here is one uid and no mount namespace: the agent can read everything dev and control can. Dev
   mode runs it (it needs ``--acknowledge-external-fence`` anyway) but says plainly that the policy and the
   secrets are not protected, and control never hot-reloads the policy file.
4. As root (models R and U) the agent runs as a dedicated unused uid/gid (``supervisor/cli/agent_ids.py``) unless
   ``--agent-user`` names one; otherwise U and P can only run it as our own uid. Either way it is printed.
5. The default workdir is ``$XDG_STATE_HOME/openshell-sandbox/<sandbox>/work`` (``supervisor/cli/state_dirs.py``),
   owned by the agent's uid, mode 0700, kept after exit and printed.
6. A ``--workdir`` given is used as it is (``.`` and relative paths made absolute by the command line): it must
   be a directory the agent's uid can write and search (read and search with ``--workdir-read-only``), or dev
   refuses to start, naming its owner and mode.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.cli.agent_ids import NoFreeAgentId, pick_agent_id
from supervisor.cli.state_dirs import StateDirError, ensure_sandbox_state_dir, events_path
from supervisor.protocol.privilege_model import PrivilegeModel

PRIVATE_DIR = "private"


class DevSetupError(Exception):
    """Dev mode cannot set the sandbox up; the message names the flag or path at fault."""


@dataclass
class DevConfinement:
    model: PrivilegeModel
    workdir: Path
    agent: tuple[int, int] | None  # passed to control as --agent-user; None: the boundary's own ids (U, P)
    boundary_flags: list[str] = field(default_factory=list)
    control_flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def parse_agent_user(text: str) -> tuple[int, int]:
    uid_text, _, gid_text = text.partition(":")
    try:
        uid, gid = int(uid_text), int(gid_text or uid_text)
    except ValueError:
        raise DevSetupError(f"--agent-user must be UID[:GID], got {text!r}") from None
    if uid < 0 or gid < 0:
        raise DevSetupError(f"--agent-user must be UID[:GID], got {text!r}")
    return uid, gid


def resolve_model(requested: str) -> tuple[PrivilegeModel, str]:
    from supervisor.boundary.process import LauncherError, detect_privilege_model

    try:
        return detect_privilege_model(requested)  # type: ignore[arg-type]
    except LauncherError as exc:
        raise DevSetupError(f"--privilege-model={requested}: {exc}") from exc


def _agent_ids(model: PrivilegeModel, agent_user: str | None) -> tuple[tuple[int, int] | None, str]:
    if os.geteuid() == 0 and model in (PrivilegeModel.R, PrivilegeModel.U):
        if agent_user is not None:
            ids = parse_agent_user(agent_user)
            if ids[0] == 0 or ids[1] == 0:
                raise DevSetupError("--agent-user: the agent never runs as root (uid or gid 0)")
            return ids, f"agent uid:gid {ids[0]}:{ids[1]} (--agent-user)"
        try:
            ident = pick_agent_id()
        except NoFreeAgentId as exc:
            raise DevSetupError(str(exc)) from exc
        return (ident, ident), f"agent uid:gid {ident}:{ident} (dedicated, unused; --agent-user to choose)"
    uid, gid = os.geteuid(), os.getegid()
    why = (
        "model P has no user namespace" if model == PrivilegeModel.P else "model U maps only our own uid when not root"
    )
    return None, f"agent uid:gid {uid}:{gid}, your own ({why})"


def _default_workdir(sandbox: str, agent: tuple[int, int] | None) -> Path:
    try:
        work = ensure_sandbox_state_dir(sandbox) / "work"
        work.mkdir(mode=0o700, exist_ok=True)
        if agent is not None:
            os.chown(work, *agent)
        os.chmod(work, 0o700)
    except (OSError, StateDirError) as exc:
        raise DevSetupError(f"default workdir: {exc} (set XDG_STATE_HOME or pass --workdir)") from exc
    return work


def _check_workdir(workdir: Path, agent: tuple[int, int], *, read_only: bool) -> None:
    """Rule 6: a ``--workdir`` the agent could not write (with ``read_only``: read and search) is refused here,
    naming its owner and mode, rather than found out by the agent's first write."""
    try:
        info = workdir.stat()
    except OSError as exc:
        raise DevSetupError(f"--workdir={workdir}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise DevSetupError(f"--workdir={workdir}: not a directory")
    uid, gid = agent
    mode = stat.S_IMODE(info.st_mode)
    if uid == 0:
        return
    if info.st_uid == uid:
        bits = mode >> 6
    elif info.st_gid == gid:
        bits = mode >> 3
    else:
        bits = mode
    needed, verb = (0o5, "read") if read_only else (0o3, "write")  # and search, either way
    if bits & needed == needed:
        return
    hint = "" if read_only else " (--workdir-read-only if it only reads it)"
    raise DevSetupError(
        f"--workdir={workdir}: the agent (uid {uid}, gid {gid}) cannot {verb} it: owned by {_owner(info.st_uid)} "
        f"(uid {info.st_uid}), group {_group(info.st_gid)} (gid {info.st_gid}), mode {mode:04o}; give the agent "
        f"{verb} access to it (chown or chmod) or choose another directory{hint}"
    )


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _private_copy(source: Path, private: Path, name: str, flag: str) -> Path:
    copy = private / name
    try:
        with source.open("rb") as src, open(copy, "xb") as dst:
            os.fchmod(dst.fileno(), 0o600)
            shutil.copyfileobj(src, dst)
    except OSError as exc:
        raise DevSetupError(f"{flag}: cannot copy {source}: {exc.strerror or exc}") from exc
    return copy


def _read_write_paths(policy: Path) -> tuple[str, ...]:
    from supervisor.control.policy import PolicyInvalid, load_policy_file

    try:
        fs = load_policy_file(policy).filesystem_policy
    except (PolicyInvalid, OSError):
        return ()  # control reports it and refuses to start
    return fs.read_write if fs is not None else ()


def prepare(
    *,
    sandbox: str,
    tmp: Path,
    runtime_parent: Path,
    model: PrivilegeModel,
    workdir: str | None,
    agent_user: str | None,
    policy: Path | None,
    credentials: Path | None,
    inference_routes: Path | None = None,
    workdir_read_only: bool = False,
) -> DevConfinement:
    """Copies, ids, workdir and flags for both daemons (rules 1-5). ``tmp`` is dev's private directory."""
    from supervisor.control.policy.watch_safety import agent_writable_paths, decide_watch

    agent, who = _agent_ids(model, agent_user)
    if workdir is not None:
        _check_workdir(Path(workdir), agent or (os.geteuid(), os.getegid()), read_only=workdir_read_only)
    work = Path(workdir) if workdir is not None else _default_workdir(sandbox, agent)
    plan = DevConfinement(model=model, workdir=work, agent=agent)
    plan.notes.append(who)
    plan.notes.append(f"workdir {work}" + (" (kept after exit)" if workdir is None else ""))
    private = tmp / PRIVATE_DIR
    private.mkdir(mode=0o700)
    (tmp / "interception").mkdir(mode=0o700, exist_ok=True)  # control's CA; must exist to be hidden
    control = plan.control_flags
    control.append(f"--agent-writable={work}")
    if agent is not None:
        control.append(f"--agent-user={agent[0]}:{agent[1]}")
    if policy is not None:
        original = policy.absolute()
        control += [f"--policy={_private_copy(original, private, 'policy.yaml', '--policy')}",
                    f"--policy-source={original}"]  # fmt: skip
        writable = agent_writable_paths([str(work)], _read_write_paths(original))
        _, why = decide_watch(original, model == PrivilegeModel.P, writable)
        plan.notes.append(f"policy {why}")
    if model == PrivilegeModel.P:
        control.append("--no-policy-watch")
        plan.notes.append(
            "model P: no mount namespace and the agent runs as your uid: it can read and change the policy "
            "file, the credentials and control's keys; secrets are NOT protected (use model R or U for that)"
        )
    if credentials is not None:
        copy = _private_copy(credentials.absolute(), private, "credentials", "--credentials")
        control.append(f"--credentials={copy}")
    if inference_routes is not None:  # watched at the original, as the policy is
        original = inference_routes.absolute()
        copy = _private_copy(original, private, "inference-routes.yaml", "--inference-routes")
        control += [f"--inference-routes={copy}", f"--inference-routes-source={original}"]
    hidden = [runtime_parent, tmp, private, tmp / "bundle" / "control", tmp / "interception", events_path(sandbox),
              *(p.absolute() for p in (policy, credentials, inference_routes) if p is not None)]  # fmt: skip
    plan.boundary_flags += [f"--privilege-model={model}", f"--workdir={work}"]
    plan.boundary_flags += [f"--hide-path={path}" for path in hidden]
    return plan
