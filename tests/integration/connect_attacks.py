"""Attacks on connect-time identity, run as the agent by tests/integration/test_connect_identity.py.

``python3 connect_attacks.py CASE PORT`` prints one JSON object: what the "boundary" (the test) answered for
each connection this case made (its last line: the identity it resolved, or the refusal), and what the kernel
said to the agent. The server side answers an HTTP/1.0 response whose body is that JSON, so curl can be a
client too. Nothing here may need more than the agent's own rights.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import subprocess
import sys
import time

HOST = "127.0.0.1"
SH = "/bin/sh"
CURL = "/usr/bin/curl"


def ask(sock: socket.socket) -> object:
    """Ask the server to resolve this connection; its verdict (the response body's last line)."""
    sock.sendall(b"resolve\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return last_json(data)


def last_json(data: bytes) -> object:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"raw": data.decode(errors="replace")}


def dial(port: int) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(20)
    sock.connect((HOST, port))
    return sock


def plain(port: int) -> dict[str, object]:
    return {"verdict": ask(dial(port))}


def descendant(port: int) -> dict[str, object]:
    """A real descendant: sh runs curl, which connects."""
    out = subprocess.run([SH, "-c", f"{CURL} -s http://{HOST}:{port}/"], capture_output=True, timeout=30)
    return {"verdict": last_json(out.stdout)}


def scm_rights_then_exec(port: int) -> dict[str, object]:
    """Connect, pass the socket to a helper over SCM_RIGHTS, close ours; the helper execs sh on it."""
    ours, theirs = socket.socketpair()
    helper = subprocess.Popen(
        [sys.executable, "-c", HELPER],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
        env={"FD": str(theirs.fileno())},
    )
    theirs.close()
    sock = dial(port)
    # dial()'s timeout left O_NONBLOCK on the open file, which the helper's sh and cat share: cat would read
    # EAGAIN (and print nothing) whenever the answer is not there yet, as on a loaded machine
    sock.setblocking(True)
    socket.send_fds(ours, [b"s"], [sock.fileno()])
    sock.close()
    ours.close()
    out, _ = helper.communicate(timeout=30)
    return {"verdict": last_json(out)}


HELPER = """
import os, socket
chan = socket.socket(fileno=int(os.environ["FD"]))
_, fds, _, _ = socket.recv_fds(chan, 16, 1)
os.dup2(fds[0], 3)
os.execv("/bin/sh", ["sh", "-c", "printf 'resolve\\\\n' >&3; cat <&3"])
"""


def fork_before_exec(port: int) -> dict[str, object]:
    """Fork a child first; the parent then execs sh; only then the child connects."""
    read_end, write_end = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.close(result_r)
        deadline = time.monotonic() + 20
        while os.path.realpath(f"/proc/{os.getppid()}/exe") != os.path.realpath(SH) and time.monotonic() < deadline:
            time.sleep(0.01)
        verdict = {"verdict": ask(dial(port)), "parent_exe": os.path.realpath(f"/proc/{os.getppid()}/exe")}
        os.write(result_w, json.dumps(verdict).encode())
        os._exit(0)
    os.close(write_end)
    os.close(result_w)
    # the parent (the agent) becomes sh: it lives until the child is done, then reports for it
    os.dup2(read_end, 0)
    os.dup2(result_r, 4)
    os.execv(SH, ["sh", "-c", "cat >/dev/null; cat <&4"])
    raise AssertionError("unreachable")


def preload(port: int) -> dict[str, object]:
    env = dict(os.environ, LD_PRELOAD="/nonexistent/preload.so")
    out = subprocess.run([CURL, "-s", f"http://{HOST}:{port}/"], capture_output=True, env=env, timeout=30)
    return {"verdict": last_json(out.stdout)}


def preload_scrubbed(port: int) -> dict[str, object]:
    """Under LD_PRELOAD, erase the variable from our own environment block, then connect (and a fork of us)."""
    env = dict(os.environ, LD_PRELOAD="/nonexistent/preload.so")
    out = subprocess.run([sys.executable, __file__, "scrub_inner", str(port)], capture_output=True, env=env, timeout=30)
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))


def scrub_environ() -> bool:
    """Rename LD_PRELOAD in our own environment block (in place, where a read-only /proc leaves ``mem`` closed);
    whether /proc/self/environ no longer shows it."""
    with open("/proc/self/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5) fields 50, 51)
    block = ctypes.string_at(start, end - start)
    ctypes.memmove(start, block.replace(b"LD_PRELOAD=", b"XX_PRELOAD="), end - start)
    with open("/proc/self/environ", "rb") as handle:
        return b"LD_PRELOAD" not in handle.read()


def scrub_inner(port: int) -> dict[str, object]:
    scrubbed = scrub_environ()
    verdict = ask(dial(port))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, json.dumps(ask(dial(port))).encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    child = json.loads(os.read(read_end, 65536))
    return {"scrubbed": scrubbed, "verdict": verdict, "child": child}


def library_path(port: int) -> dict[str, object]:
    """LD_LIBRARY_PATH naming a directory the agent can write, then one it cannot."""
    verdicts = {}
    for name, value in (("writable", "/tmp"), ("system", "/usr/lib")):
        env = dict(os.environ, LD_LIBRARY_PATH=value)
        out = subprocess.run([CURL, "-s", f"http://{HOST}:{port}/"], capture_output=True, env=env, timeout=30)
        verdicts[name] = last_json(out.stdout)
    return {"verdicts": verdicts}


def fastopen(port: int) -> dict[str, object]:
    sock = socket.socket()
    try:
        sock.sendto(b"resolve\n", socket.MSG_FASTOPEN, (HOST, port))
        return {"fastopen": "sent", "verdict": ask(sock)}
    except OSError as exc:
        return {"fastopen": errno.errorcode.get(exc.errno or 0, str(exc.errno)), "then": plain(port)["verdict"]}


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def second_listener(port: int) -> dict[str, object]:
    """Install our own listener filter (allow everything) to answer our own connects: refused."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    allow = (ctypes.c_uint64 * 1)(0x7FFF0000 << 32 | 0x06)  # BPF_RET|BPF_K, k=SECCOMP_RET_ALLOW
    prog = _Fprog(1, ctypes.cast(allow, ctypes.c_void_p))
    nr = {"x86_64": 317, "aarch64": 277}[os.uname().machine]
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS (already set by the launcher)
    result = libc.syscall(ctypes.c_long(nr), ctypes.c_long(1), ctypes.c_long(1 << 3), ctypes.byref(prog))
    err = ctypes.get_errno()
    listener = "installed" if result >= 0 else errno.errorcode.get(err, str(err))
    return {"listener": listener, "then": plain(port)["verdict"]}


def held_fds(port: int) -> dict[str, object]:
    """What the agent holds besides stdio, then a plain connect: with a seccomp listener it could answer its own
    notifications, with a Landlock ruleset it could hand it on."""
    held = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            held[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own fd, closed by now
    return {"fds": held, "verdict": plain(port)["verdict"]}


def stalled(port: int) -> dict[str, object]:
    started = time.monotonic()
    sock = dial(port)
    connected_after = time.monotonic() - started
    return {"connected_after_s": connected_after, "verdict": ask(sock)}


def boundary_gone(port: int) -> dict[str, object]:
    sys.stdin.readline()  # the test closes the listeners, then says go
    try:
        dial(port)
    except OSError as exc:
        return {"connect": errno.errorcode.get(exc.errno or 0, str(exc.errno))}
    return {"connect": "ok"}


def reexec_preload_scrubbed(port: int) -> dict[str, object]:
    """Re-execute ourselves (the same pid) under LD_PRELOAD as ``scrub_inner``, which erases the variable from its
    own environment block before it connects: only the execve's notification can tell."""
    env = dict(os.environ, LD_PRELOAD="/nonexistent/preload.so")
    os.execve(sys.executable, [sys.executable, __file__, "scrub_inner", str(port)], env)


# One batch of the churn, run by sh: ``batch`` forks that each try to exec what does not exist (the boundary is told
# of the execve before the kernel fails it), then the shell's own failed exec while they are its children (or
# zombies): each fork leaves the exec log a loader entry and an image-at-creation entry, for two cheap syscalls.
CHURN = """i=0
while [ $i -lt {batch} ]; do
  (exec /nonexistent/churn) 2>/dev/null &
  i=$((i+1))
done
exec /nonexistent/churn 2>/dev/null
"""


def churn(rounds: int, batch: int = 250) -> None:
    """``rounds`` short-lived processes (:data:`CHURN`), reaped by a subreaper forked for the purpose."""
    pid = os.fork()
    if pid == 0:
        try:
            ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: a batch's orphans come back here
            for _ in range(-(-rounds // batch)):
                os.posix_spawn(SH, [SH, "-c", CHURN.format(batch=batch)], dict(os.environ))
                while True:
                    try:
                        os.waitpid(-1, 0)
                    except ChildProcessError:
                        break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def churn_then_connect(port: int) -> dict[str, object]:
    """A child forked before its parent execs sh, and a process exec'd under LD_PRELOAD that erases it from its
    environment block, each connect before and after ``$CHURN_ROUNDS`` short-lived processes (far more than a
    log that forgets the oldest would hold)."""
    rounds = int(os.environ.get("CHURN_ROUNDS", "100000"))
    read_end, write_end = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.close(result_r)
        deadline = time.monotonic() + 20
        while os.path.realpath(f"/proc/{os.getppid()}/exe") != os.path.realpath(SH) and time.monotonic() < deadline:
            time.sleep(0.01)
        report: dict[str, object] = {"parent_exe": os.path.realpath(f"/proc/{os.getppid()}/exe")}
        report["before"] = ask(dial(port))
        env = dict(os.environ, LD_PRELOAD="/nonexistent/preload.so")
        preloaded = subprocess.Popen(
            [sys.executable, __file__, "scrub_wait", str(port)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert preloaded.stdin is not None and preloaded.stdout is not None
        report["preloaded_before"] = json.loads(preloaded.stdout.readline())
        started = time.monotonic()
        churn(rounds)
        report["churn_s"] = round(time.monotonic() - started, 1)
        preloaded.stdin.write(b"go\n")
        preloaded.stdin.flush()
        report["preloaded_after"] = json.loads(preloaded.stdout.readline())
        preloaded.wait(timeout=30)
        report["after"] = ask(dial(port))
        os.write(result_w, json.dumps(report).encode())
        os._exit(0)
    os.close(write_end)
    os.close(result_w)
    os.dup2(read_end, 0)
    os.dup2(result_r, 4)
    os.execv(SH, ["sh", "-c", "cat >/dev/null; cat <&4"])  # the parent becomes sh; reports for its child at the end
    raise AssertionError("unreachable")


def scrub_wait(port: int) -> dict[str, object]:
    """``scrub_inner``'s erasure, then one connection now and one once told on stdin (each verdict a line)."""
    scrubbed = scrub_environ()
    print(json.dumps({"scrubbed": scrubbed, "verdict": ask(dial(port))}), flush=True)
    sys.stdin.readline()
    return {"scrubbed": scrubbed, "verdict": ask(dial(port))}


CASES = {
    "plain": plain,
    "reexec_preload_scrubbed": reexec_preload_scrubbed,
    "descendant": descendant,
    "scm_rights_then_exec": scm_rights_then_exec,
    "fork_before_exec": fork_before_exec,
    "preload": preload,
    "library_path": library_path,
    "preload_scrubbed": preload_scrubbed,
    "scrub_inner": scrub_inner,
    "fastopen": fastopen,
    "second_listener": second_listener,
    "held_fds": held_fds,
    "stalled": stalled,
    "boundary_gone": boundary_gone,
    "churn_then_connect": churn_then_connect,
    "scrub_wait": scrub_wait,
}

if __name__ == "__main__":
    print(json.dumps(CASES[sys.argv[1]](int(sys.argv[2]))), flush=True)
