"""How the product starts its own Python processes: isolated from whatever the caller's interpreter would import
(docs/design.md "Our own interpreters").

A process of ours runs next to credentials (control), as root (the boundary in model R, root dev mode), or next
to the workload (the launcher, the exec-inits). None of them may import a module from a place the agent, or any
user but root and us, can write; and none may take its interpreter settings from the caller's environment.

Rules:

1. Every Python process we start runs ``python -I -S -c BOOT N PATH… ARGS…``: no current or script directory
   on ``sys.path``, no ``PYTHON*`` variable, no user site and no ``.pth`` file has a say. The ``N`` entries
   ``PATH…`` are the import path of rule 2; ``BOOT`` puts them in place and imports only from them.
2. The import path is the installation's: this interpreter's ``sys.path`` without the entries a caller chose —
   the script's or current directory (``sys.path[0]`` of an interpreter started without ``-I``/``-P``),
   ``PYTHONPATH``'s entries, empty and relative entries — and the directory holding the ``supervisor`` package
   where that is not on it already (an editable install's finder is a ``.pth`` file, which ``-S`` skips). A
   ``PYTHONPATH`` entry that *is* that directory stays in its place: it is how a copy of the package is run.
3. The installation must be writable by nobody but root and us: every directory on the import path and each of
   its ancestors, and every directory and file of the ``supervisor`` package, is owned by root or our euid and
   writable by neither its group nor others (a sticky directory such as ``/tmp`` may be world-writable: nobody
   can replace our entries in it). :func:`installation_problem` names the first path that is not; the callers
   refuse to start, since whoever can write there can run code in our processes.
4. The environment is composed, never inherited: a fixed ``PATH``; passed through from ours only ``TZ``, the
   locale (``LANG``, ``LANGUAGE``, ``LC_*``), the upstream trust (``SSL_CERT_FILE``, ``SSL_CERT_DIR``), the test
   knobs the daemons read, and the names a caller adds (the ``secret_env`` variables of control's credentials).
   A name on the deny-list (loader and interpreter variables such as ``LD_*``, ``PYTHON*``, ``GCONV_PATH``,
   ``MALLOC_*``, ``OPENSSL_CONF``) is never passed, whoever names it.
"""

from __future__ import annotations

# Only modules every interpreter has loaded before any code of ours runs: the command line's entry
# (supervisor/cli/entry.py) uses this module before anything could be imported from a caller's path.
import os
import stat
import sys

__all__ = [
    "CLI_MAIN",
    "DAEMON_PATH",
    "PASSED_THROUGH",
    "cli_argv",
    "composed_environment",
    "denied_variable",
    "import_path",
    "installation_problem",
    "isolated_argv",
    "package_root",
]

DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSED_THROUGH = frozenset(
    {
        "TZ", "LANG", "LANGUAGE", "SSL_CERT_FILE", "SSL_CERT_DIR",
        # the daemons' own test and benchmark knobs (supervisor/cli/daemon_run.py, supervisor/boundary/capture_start.py)
        "OPENSHELL_TEST_LANDLOCK_OFF", "OPENSHELL_BENCH_NO_CONNECT_NOTIFY",
    }
)  # fmt: skip
_DENIED_PREFIXES = ("LD_", "PYTHON", "MALLOC_", "GLIBC_", "DYLD_")
_DENIED = frozenset(
    {
        "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN", "TMPDIR", "OPENSSL_CONF",
        "OPENSSL_ENGINES", "OPENSSL_MODULES", "SSLKEYLOGFILE", "IFS", "ENV", "BASH_ENV", "PERL5LIB", "PERL5OPT",
        "NODE_OPTIONS", "RUBYOPT",
    }
)  # fmt: skip

# Rule 1's boot: the import path from argv, then ``CODE`` with the rest of argv as its own.
_BOOT = "import sys; n = int(sys.argv[1]); sys.path[:] = sys.argv[2 : 2 + n]; del sys.argv[1 : 2 + n]; "
CLI_MAIN = "from supervisor.cli.main import main; sys.exit(main())"


def package_root() -> str:
    """The directory holding the ``supervisor`` package this module is part of."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_path() -> list[str]:
    """Rule 2: this interpreter's import path less what a caller chose, with the package's root on it."""
    root = package_root()
    entries = list(sys.path)
    if entries and not (sys.flags.isolated or sys.flags.safe_path):
        entries = entries[1:]  # the script's directory, or the current one for -m and -c
    chosen: set[str] = set()
    if not sys.flags.ignore_environment:
        chosen = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    path: list[str] = []
    for entry in entries:
        if not entry or not os.path.isabs(entry):
            continue
        entry = os.path.normpath(entry)
        if (entry in chosen and entry != root) or entry in path:
            continue
        path.append(entry)
    if root not in path:
        path.append(root)
    return path


def isolated_argv(code: str, path: list[str], *args: str) -> list[str]:
    """Rule 1: the argv of a fresh interpreter of ours that runs ``code`` on ``path``, ``args`` in its argv."""
    if not sys.executable:
        raise OSError("this interpreter does not know its own executable")
    return [sys.executable, "-I", "-S", "-c", _BOOT + code, str(len(path)), *path, *args]


def cli_argv(*args: str) -> list[str]:
    """``openshell-sandbox ARGS…`` as a process of ours (the daemons dev mode starts)."""
    return isolated_argv(CLI_MAIN, import_path(), *args)


def denied_variable(name: str) -> bool:
    """Rule 4's deny-list: variables that change how a program loads or what it runs."""
    return name in _DENIED or name.startswith(_DENIED_PREFIXES)


def composed_environment(
    extra: list[str] | tuple[str, ...] = (), environ: dict[str, str] | None = None
) -> dict[str, str]:
    """Rule 4: the environment of a process of ours, from ``environ`` (default: ours)."""
    source = dict(os.environ) if environ is None else environ
    names = {*PASSED_THROUGH, *extra, *(n for n in source if n.startswith("LC_"))}
    env = {name: source[name] for name in sorted(names) if name in source and not denied_variable(name)}
    env["PATH"] = DAEMON_PATH
    return env


def installation_problem(path: list[str] | None = None, *, euid: int | None = None) -> str | None:
    """Rule 3: the first place of the installation that someone other than root and ``euid`` can write, said
    with its owner and mode; None when there is none."""
    uid = os.geteuid() if euid is None else euid
    seen: set[str] = set()
    places: list[str] = []
    for entry in path if path is not None else import_path():
        here = entry
        while True:  # the entry and every ancestor: whoever can write one can replace what is below it
            if here not in seen:
                seen.add(here)
                places.append(here)
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
    package = os.path.join(package_root(), "supervisor")
    for top, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        places.extend(os.path.join(top, name) for name in (*dirs, *files))
    for place in places:
        try:
            info = os.lstat(place)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{place}: cannot check who can write it: {exc.strerror or exc}"
        problem = _writable_by_others(info, uid)
        if problem is not None:
            return f"{place} {problem}"
    return None


def _writable_by_others(info: os.stat_result, uid: int) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return None if info.st_uid in (0, uid) else f"is a symlink owned by uid {info.st_uid}"
    if info.st_uid not in (0, uid):
        return f"is owned by uid {info.st_uid}"
    sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
    if info.st_mode & stat.S_IWOTH and not sticky:
        return f"is writable by everyone (mode {stat.S_IMODE(info.st_mode):04o})"
    if info.st_mode & stat.S_IWGRP and info.st_gid != 0 and not sticky:
        return f"is writable by group {info.st_gid} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None
