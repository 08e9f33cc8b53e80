"""The operator subcommands that talk to control's API: status, readyz, exec, wait, signal, terminate, forward."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys

import trio

from supervisor.cli.api_client import Api, ApiError, find_api, open_channel, request_json
from supervisor.cli.dev_console import launch_failure_line
from supervisor.cli.exec_client import run_exec_client
from supervisor.cli.human import clean, format_size
from supervisor.link.relay import relay
from supervisor.protocol.agent_ended import why_ended
from supervisor.protocol.exit_codes import ExitCode, for_launch_errno
from supervisor.protocol.exit_result import ExitResult, ExitResultError
from supervisor.protocol.json_value import JsonValue, is_json_object


def _print_json(body: JsonValue) -> None:
    print(json.dumps(body, indent=2, sort_keys=True))


def _fail(status: int, body: dict[str, JsonValue]) -> int:
    reason = body.get("reason") or body.get("raw") or f"HTTP {status}"
    kind = body.get("kind", "error")
    field = body.get("field")
    where = f" ({field})" if isinstance(field, str) and field not in str(reason) else ""
    print(f"openshell-sandbox: {kind}: {reason}{where}", file=sys.stderr)
    return ExitCode.SELF_FAILED


async def _agent_handle(api: Api) -> str:
    status, body = await request_json(api, "GET", "/v1/status")
    handle = ((body.get("boundary") or {}).get("agent") or {}).get("handle")
    if status == 200 and (body.get("topology") or {}).get("name") == "proxy-pod":
        raise ApiError("not available in the proxy-pod topology: the workload runs no supervisor (no exec, PTY, "
                       "forward, signal, wait or process policy)")  # fmt: skip
    if status != 200 or not handle:
        raise ApiError("the agent has no handle yet (is the sandbox running?)")
    return str(handle)


async def run(args: argparse.Namespace) -> int:
    api = find_api(args.api, args.cert)
    command = args.command
    if command == "status":
        return await _status(api, args.json)
    if command == "readyz":
        status, body = await request_json(api, "GET", "/readyz")
        for condition in body.get("failing", []):
            print(condition, file=sys.stderr)
        return 0 if status == 200 else 1
    if command == "exec":
        return await _exec(api, args)
    if command == "forward":
        return await _forward(api, args.spec)
    if command == "cp":
        from supervisor.cli.copy import run_cp

        return await run_cp(api, args)
    if command == "attach":
        try:
            stream, _reply = await open_channel(api, "/v1/attach-stream", {"handle": args.handle})
        except ApiError as exc:
            return _launch_failure(exc)
        async with stream:  # output only: the PTY (if any) is shown as it comes, our terminal left alone
            return await run_exec_client(stream, tty=False, interactive=False)
    handle = args.handle or await _agent_handle(api)
    if command == "wait":
        body_in: dict[str, JsonValue] = {"handle": handle}
        if args.timeout is not None:
            body_in["timeout_s"] = args.timeout
        status, body = await request_json(api, "POST", "/v1/wait", body_in)
        if status != 200:
            return _fail(status, body)
        _print_json(body)
        try:
            return ExitResult.from_wire(body).exit_code  # as an exec's own client would exit
        except ExitResultError as exc:
            print(f"openshell-sandbox: wait: {exc}", file=sys.stderr)
            return ExitCode.SELF_FAILED
    if command == "signal":
        scope = "group" if args.group else "process"
        request = {"handle": handle, "signal": args.signal.upper().removeprefix("SIG"), "scope": scope}
        status, body = await request_json(api, "POST", "/v1/signal", request)
    else:  # terminate
        status, body = await request_json(api, "POST", "/v1/terminate", {"handle": handle, "grace_s": args.grace})
    if status != 200:
        if isinstance(body.get("result"), dict):  # terminated already: what ended it, as `wait` prints it
            _print_json(body["result"])
        return _fail(status, body)
    _print_json(body)
    return 0


def _gone_lines(gone: JsonValue) -> list[str]:
    """Past --workload-gone-after without a link: since when, and the commands that remove the sandbox."""
    if not is_json_object(gone) or not gone:
        return []
    seconds = gone.get("seconds")
    minutes = int(seconds) // 60 if isinstance(seconds, int | float | str) and seconds else 0
    delete = gone.get("delete")
    return [
        f"workload    gone since {gone.get('since')} ({minutes} min); remove the sandbox:",
        *(f"  {command}" for command in (delete if isinstance(delete, list) else [])),
    ]


def _activity_lines(activity: JsonValue) -> list[str]:
    """docs/reference/policy.md §4.3's counters: attempts and requests, denials and their non-zero groups."""
    if not isinstance(activity, dict):
        return []
    groups = activity.get("denials_by_group")
    counts = groups if isinstance(groups, dict) else {}
    denied = ", ".join(f"{group} {counts[group]}" for group in sorted(counts) if counts[group])
    return [f"activity    {activity.get('network_activity_count', 0)} connections and requests, "
            f"{activity.get('denied_action_count', 0)} denied" + (f" ({denied})" if denied else "")]  # fmt: skip


async def _status(api: Api, raw: bool) -> int:
    status, body = await request_json(api, "GET", "/v1/status")
    if status != 200:
        return _fail(status, body)
    if raw:
        _print_json(body)
        return 0
    boundary = body.get("boundary") or {}
    policy = body.get("policy") or {}
    agent = boundary.get("agent") or {}
    lines = [
        f"sandbox     {body.get('namespace')}/{body.get('sandbox')} (generation {body.get('generation')})",
        f"ready       {'yes' if body.get('ready') else 'no'}",
        f"link        {'up' if (body.get('link') or {}).get('up') else 'down'}",
        *_gone_lines((body.get("link") or {}).get("workload_gone")),
        f"lifecycle   {boundary.get('state', 'unknown')}  model {boundary.get('privilege_model', '?')}"
        f"  capture {boundary.get('capture_mode', '?')}",
        f"policy      generation {policy.get('generation')} {policy.get('status')}  ({policy.get('source')})"
        f"  acknowledged {boundary.get('policy_generation')}",
        f"agent       {agent.get('handle', '-')}  {json.dumps(agent.get('result')) if agent.get('result') else ''}",
        f"processes   {len(boundary.get('processes') or [])} running",
        *_process_lines(boundary.get("processes")),
        _fence_line(boundary.get("fence")),
        *_limit_lines(boundary.get("limits")),
        *_activity_lines(body.get("activity")),
        *_worker_lines(body.get("workers")),
    ]
    interception = body.get("interception") or {}
    if interception.get("ca_sha256"):
        match = interception.get("match")
        trust = (
            "the agent trusts it" if match is True
            else f"NOT the CA the agent trusts ({interception.get('boundary_ca_sha256')})" if match is False
            else "not given to the agent yet"
        )  # fmt: skip
        lines.append(f"inspection  CA {interception['ca_sha256']}  {trust}")
    for item in (body.get("certificates") or {}).get("expiring", []):
        lines.append(f"certificate {item}")
    print("\n".join(lines))
    return 0


def _worker_lines(workers: JsonValue) -> list[str]:
    """With --workers above 1: one line for the processes serving egress besides the primary."""
    if not isinstance(workers, list) or not workers:
        return []
    parts = [
        f"{w.get('index')}: pid {w.get('pid')} generation {w.get('generation')} live {w.get('live')}"
        for w in workers
        if isinstance(w, dict)
    ]
    return [f"workers     {len(parts) + 1} processes (this one and {'; '.join(parts)})"]


def _process_lines(processes: JsonValue) -> list[str]:
    """One line per process: handle, kind, state, start time and argv (placeholders already redacted by the
    boundary; terminal-safe: an argv is anyone's text)."""
    if not isinstance(processes, list):
        return []
    lines = []
    for process in processes:
        if not isinstance(process, dict):
            continue
        argv = process.get("argv")
        argv = argv if isinstance(argv, list) else []
        lines.append(f"            {clean(process.get('handle', '?'))}  {clean(process.get('kind', '?')):<5} "
                     f"{clean(process.get('state', '?'))}  since {clean(process.get('started_at', '?'))}  "
                     f"{clean(shlex.join(str(a) for a in argv))}")  # fmt: skip
    return lines


def _limit_lines(limits: JsonValue) -> list[str]:
    """One line per limit: its value and how it is held, or ``unenforced`` and why."""
    if not isinstance(limits, dict):
        return []

    def one(label: str, key: str, shown: str, how: str) -> str:
        value = limits.get(key)
        if value == "unenforced":
            return f"{label:<18}unenforced: {clean(limits.get(f'{key}_reason') or 'no reason given')}"
        if value is None:
            return f"{label:<18}not set up yet"
        return f"{label:<18}{shown}  {how}".rstrip()

    memory = limits.get("memory")
    oom = limits.get("oom_score_adj")
    memory_now = limits.get("memory_current")
    memory_how = ", ".join(
        part
        for part in (
            clean(limits.get("memory_cgroup") or ""),
            f"{format_size(memory_now)} now" if isinstance(memory_now, int) else "",
            f"{limits['memory_oom_kills']} OOM kills" if isinstance(limits.get("memory_oom_kills"), int) else "",
            f"swap {clean(limits['memory_swap'])}" if limits.get("memory_swap") else "",
            f"workload oom_score_adj {oom}" + ("" if limits.get("oom_score_adj_floor") else " (no floor)")
            if isinstance(oom, int)
            else "",
        )
        if part
    )
    pids_now = limits.get("pids_current")
    lines = [
        one("pids", "pids", str(limits.get("pids")), clean(limits.get("pids_cgroup") or "")
            + (f", {pids_now} now" if isinstance(pids_now, int) else "")),
        one("memory", "memory", format_size(memory) if isinstance(memory, int) else str(memory), memory_how),
        one("workdir size", "workdir_size", str(limits.get("workdir_size")), ""),
        one("/tmp size", "tmp_size", str(limits.get("tmp_size")), "tmpfs"),
        one("/dev/shm size", "shm_size", str(limits.get("shm_size")), "tmpfs"),
    ]  # fmt: skip
    if oom == "unenforced":
        lines.append(one("oom_score_adj", "oom_score_adj", "", ""))
    elif isinstance(oom, int) and limits.get("oom_score_adj_floor") is False:
        lines.append(f"{'oom_score_adj':<18}{oom}, no floor: {clean(limits.get('oom_score_adj_floor_reason') or '?')}")
    return [f"limits      {line}" if i == 0 else f"            {line}" for i, line in enumerate(lines)]


def _fence_line(fence: JsonValue) -> str:
    """How the fence was confirmed: captured (netns probe), canary (model P observed) or acknowledged-unprobed."""
    if not isinstance(fence, dict):
        return "fence       not confirmed"
    where = f" {fence['canary']}" if fence.get("canary") else ""
    return f"fence       {fence.get('mode', '?')}  probe {fence.get('probe', '?')}{where}"


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ApiError(f"--env takes K=V, got {pair!r}")
        env[key] = value
    return env


async def _exec(api: Api, args: argparse.Namespace) -> int:
    body: dict[str, JsonValue] = {
        "argv": args.argv,
        "env": {**_parse_env(args.env)},  # a copy, typed as a JSON object
        "tty": bool(args.tty),
        "stdin": "pipe" if args.interactive else "null",
        "timeout_s": args.timeout,
    }
    if args.workdir:
        body["cwd"] = args.workdir
    if args.tty:
        import os
        import shutil

        size = shutil.get_terminal_size() if os.isatty(1) else os.terminal_size((80, 24))
        body["cols"], body["rows"] = size.columns, size.lines
    if args.detach:
        if args.interactive:
            raise ApiError("exec --detach takes no stdin (-i): nothing would be left to send it")
        body["stdin"] = "null"
    try:
        stream, reply = await open_channel(api, "/v1/exec", body)
    except ApiError as exc:
        return _launch_failure(exc, program=args.argv[0])
    if args.detach:  # the process keeps running without a stream; its output is kept for `attach`
        await stream.aclose()
        print(reply.get("handle", "?"), file=sys.stderr)
        return 0
    async with stream:
        return await run_exec_client(stream, tty=bool(args.tty), interactive=bool(args.interactive))


def _launch_failure(exc: ApiError, program: str | None = None) -> int:
    body = exc.body
    err = body.get("errno")
    if program is not None and body.get("stage") and isinstance(err, int):
        print(launch_failure_line(program, body), file=sys.stderr)  # cannot run PROGRAM: REASON
        return for_launch_errno(err)
    field = body.get("field")  # e.g. env.KEY: the refused key by name, so the operator can fix it
    where = f" ({field})" if isinstance(field, str) and field not in str(exc) else ""
    print(f"openshell-sandbox: {body.get('kind', 'error')}: {exc}{where}", file=sys.stderr)
    if body.get("stage") and isinstance(err, int):
        return for_launch_errno(err)
    return ExitCode.SELF_FAILED


def parse_forward_spec(spec: str) -> tuple[str, int, str, int]:
    """``[LOCAL_ADDR:]LOCAL_PORT:[REMOTE_HOST:]REMOTE_PORT``; remote host defaults to 127.0.0.1."""
    parts = _split_spec(spec)
    if len(parts) == 2:
        local_addr, local_port, remote_host, remote_port = "127.0.0.1", parts[0], "127.0.0.1", parts[1]
    elif len(parts) == 3:
        if parts[0].isdigit():
            local_addr, local_port, remote_host, remote_port = "127.0.0.1", parts[0], parts[1], parts[2]
        else:
            local_addr, local_port, remote_host, remote_port = parts[0], parts[1], "127.0.0.1", parts[2]
    elif len(parts) == 4:
        local_addr, local_port, remote_host, remote_port = parts
    else:
        raise ApiError(f"forward spec {spec!r} is not [LOCAL_ADDR:]LOCAL_PORT:[REMOTE_HOST:]REMOTE_PORT")
    if not (local_port.isdigit() and remote_port.isdigit()):
        raise ApiError(f"forward spec {spec!r}: ports must be numbers")
    return local_addr, int(local_port), remote_host, int(remote_port)


def _split_spec(spec: str) -> list[str]:
    parts: list[str] = []
    rest = spec
    while rest:
        if rest.startswith("["):
            end = rest.find("]")
            if end < 0:
                raise ApiError(f"forward spec {spec!r}: unclosed [")
            parts.append(rest[1:end])
            rest = rest[end + 1 :].removeprefix(":")
        else:
            head, _, rest = rest.partition(":")
            parts.append(head)
    return parts


async def _forward(api: Api, spec: str) -> int:
    """Listen locally and open one forward channel per connection, until the sandbox ends (then exit 0 saying
    so) or the user interrupts."""
    local_addr, local_port, remote_host, remote_port = parse_forward_spec(spec)
    # Ask once up front so a refused target fails fast with the boundary's reason; a probe never connects to the
    # target (the user's server would see a connection that sends nothing and resets).
    probe, _ = await open_channel(api, "/v1/forward", {"host": remote_host, "port": remote_port, "probe": True})
    await probe.aclose()
    handle = await _agent_handle(api)
    listeners = await trio.open_tcp_listeners(local_port, host=local_addr)
    bound = listeners[0].socket.getsockname()
    print(f"forwarding {bound[0]}:{bound[1]} -> {remote_host}:{remote_port} in the workload", file=sys.stderr)

    async def one(client: trio.SocketStream) -> None:
        try:
            remote, _ = await open_channel(api, "/v1/forward", {"host": remote_host, "port": remote_port})
        except ApiError as exc:
            print(f"openshell-sandbox: forward refused: {exc}", file=sys.stderr)
            await client.aclose()
            return
        await relay(client, remote, idle_timeout=math.inf)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, one, listeners)
        why = await _sandbox_end(api, handle)
        nursery.cancel_scope.cancel()
    print(f"openshell-sandbox: forward stopped: {why}", file=sys.stderr)
    return 0


async def _sandbox_end(api: Api, agent: str) -> str:
    """Return, saying why, once the sandbox has ended: the agent's result came, or its API is gone (dev mode
    exited). A control that is restarting (unavailable) is waited for."""
    import h11

    while True:
        try:
            status, body = await request_json(api, "POST", "/v1/wait", {"handle": agent})
        except (ApiError, OSError, h11.ProtocolError, trio.BrokenResourceError):
            return "the sandbox has ended (its API is gone)"
        if status == 200:
            try:
                return f"the sandbox has ended: {why_ended(ExitResult.from_wire(body))}"
            except ExitResultError:
                return "the sandbox has ended"
        if status == 410:
            return f"the sandbox has ended: {clean(body.get('reason') or 'terminated')}"
        await trio.sleep(1.0)  # unavailable meanwhile (control reattaching): ask again
