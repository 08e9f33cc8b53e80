"""Mutation testing of the modules that decide: ``python -m mutate.run MODULE [--budget SECONDS]`` (``make mutate``).

mutmut changes one operator, constant or call of a module at a time (a *mutant*) and runs the module's in-process
unit tests against it: a mutant some test fails on is killed; one every test passes on survived, and either a test
is missing or the change means nothing (an equivalent mutant, listed in docs/design.md "Testing"). Daemons in
subprocesses never load a mutant, so each module names only the tests that exercise it in the test's own process.

mutmut 3 mutates function and method bodies only: a module-level table (a frozenset of header names, a list of
address ranges, a compiled pattern) is never changed, so each such table has a test that pins every entry.

Each module runs alone in ``build/mutate/<name>`` (a fresh copy each time; ``mutants/`` there keeps mutmut's state
for ``mutmut show``), for at most its budget; the score is appended to ``mutate/scores.json``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutate"
SCORES = ROOT / "mutate" / "scores.json"


@dataclass(frozen=True)
class Module:
    path: str
    tests: tuple[str, ...]
    budget: int  # seconds for a whole run on the 2-core machine, with others' tests running beside it


MODULES: dict[str, Module] = {
    "scrub": Module("supervisor/control/l7/scrub.py", ("tests/unit/test_l7_scrub.py",), 180),
    "connect_record": Module(
        "supervisor/boundary/capture/connect_record.py", ("tests/unit/test_connect_record.py",), 300
    ),
    "authority": Module("supervisor/control/l7/authority.py", ("tests/unit/test_l7_authority.py",), 180),
    "addresses": Module(
        "supervisor/control/addresses.py",
        (
            "tests/unit/test_addresses.py",
            "tests/unit/test_nat64_local_blocked.py",
            "tests/unit/test_allowed_ips_agree.py",
        ),
        600,
    ),
    "claims": Module("supervisor/protocol/claims.py", ("tests/unit/test_claims.py",), 600),
    "tls": Module(
        "supervisor/protocol/tls.py",
        ("tests/unit/test_tls_verify.py", "tests/unit/test_trust.py", "tests/integration/test_tls_claims.py"),
        900,
    ),
    "hosts": Module(
        "supervisor/control/policy/hosts.py",
        ("tests/unit/test_policy_hosts.py", "tests/unit/test_policy_globs.py", "tests/unit/test_policy_schema.py"),
        600,
    ),
    "globs": Module("supervisor/control/policy/globs.py", ("tests/unit/test_policy_globs.py",), 1200),
    "decide": Module(
        "supervisor/control/policy/decide.py",
        (
            "tests/unit/test_policy_decide.py",
            "tests/unit/test_policy_decide_whole.py",
            "tests/unit/test_l7_protocols.py",
            "tests/unit/test_policy_index.py",
        ),
        1800,
    ),
    "compiled": Module(
        "supervisor/control/policy/compiled.py",
        ("tests/unit/test_policy_compiled.py", "tests/unit/test_policy_decide.py", "tests/unit/test_policy_index.py"),
        1800,
    ),
    "schema": Module(
        "supervisor/control/policy/schema.py",
        ("tests/unit/test_policy_document.py", "tests/unit/test_policy_schema.py"),
        2400,
    ),
    "schema_endpoint": Module(
        "supervisor/control/policy/schema_endpoint.py",
        (
            "tests/unit/test_policy_endpoint_exact.py",
            "tests/unit/test_policy_schema.py",
            "tests/unit/test_policy_protocols.py",
        ),
        2400,
    ),
}

_HUNK = re.compile(r"^@@ -(\d+)")


def _config(module: Module) -> str:
    """The project's pyproject.toml with a ``[tool.mutmut]`` table for this one module."""
    tests = ", ".join(json.dumps(t) for t in module.tests)
    return (ROOT / "pyproject.toml").read_text() + (
        "\n[tool.mutmut]\n"
        'source_paths = ["supervisor"]\n'
        f"only_mutate = [{json.dumps(module.path)}]\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]\n'
        f"pytest_add_cli_args_test_selection = [{tests}]\n"
    )


def _prepare(name: str, module: Module) -> Path:
    work = WORK / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for part in ("supervisor", "tests"):
        (work / part).symlink_to(ROOT / part)
    (work / "pyproject.toml").write_text(_config(module))
    return work


def _mutmut(work: Path, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args], cwd=work, text=True, capture_output=True, timeout=timeout,
        check=False,
    )  # fmt: skip


def _run(work: Path, budget: int) -> bool:
    """``mutmut run`` for at most ``budget`` seconds; whether it finished."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mutmut", "run"], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate()
        return False
    if proc.returncode != 0:
        sys.stderr.write(err)
    return proc.returncode == 0


def _text_start(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """The first line of the function's text as mutmut shows it: its decorators, and above them the comments (with
    the blank lines among and below them) that libcst attaches to the ``def`` rather than to what came before."""
    top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    start, above = top, top - 1
    while above >= 1 and (lines[above - 1].strip() == "" or lines[above - 1].lstrip().startswith("#")):
        if lines[above - 1].strip():
            start = above
        above -= 1
    return start


def _def_lines(path: Path) -> dict[str, int]:
    """Each function's mutmut name (``x_f``, ``xǁClassǁmethod``) → the first line of the text mutmut shows for it."""
    source = path.read_text()
    text = source.splitlines()
    lines: dict[str, int] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines[f"x_{node.name}"] = _text_start(node, text)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines[f"xǁ{node.name}ǁ{item.name}"] = _text_start(item, text)
    return lines


def _survivor(work: Path, module: Module, key: str, defs: dict[str, int], source: list[str]) -> str:
    """``file:line: old  →  new`` for a mutant that survived (the diff mutmut shows is of the function alone; should
    its line not hold the mutated text, the nearest line that does is named)."""
    function = key.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0]
    old: tuple[int, str] | None = None
    new = ""
    at = 0
    for text in _mutmut(work, "show", key).stdout.splitlines():
        hunk = _HUNK.match(text)
        if hunk:
            at = int(hunk[1])
        elif text.startswith("-") and not text.startswith("---"):
            old = old or (at, text[1:].strip())
            at += 1
        elif text.startswith("+") and not text.startswith("+++"):
            new = new or text[1:].strip()
        elif text.startswith(" "):
            at += 1
    offset, before = old or (1, "")
    line = defs.get(function, 1) + offset - 1
    if not 1 <= line <= len(source) or source[line - 1].strip() != before:
        found = [number for number, text in enumerate(source, 1) if before and text.strip() == before]
        line = min(found, key=lambda number: abs(number - line)) if found else line
    return f"{module.path}:{line}: {before}  →  {new}  ({key.rsplit('.', 1)[1]})"


def mutate(name: str, budget: int | None) -> dict[str, object]:
    module = MODULES[name]
    work = _prepare(name, module)
    started = time.monotonic()
    finished = _run(work, budget or module.budget)
    seconds = round(time.monotonic() - started)
    _mutmut(work, "export-cicd-stats")
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    defs = _def_lines(ROOT / module.path)
    source = (ROOT / module.path).read_text().splitlines()
    results = _mutmut(work, "results").stdout.splitlines()
    survivors = [
        _survivor(work, module, line.split(":")[0].strip(), defs, source)
        for line in results
        if line.strip().endswith(": survived") or line.strip().endswith(": no tests")
    ]
    score = round(100 * stats["killed"] / stats["total"], 1) if stats["total"] else 0.0
    return {
        "module": module.path,
        "tests": list(module.tests),
        "mutants": stats["total"],
        "killed": stats["killed"],
        "survived": stats["survived"],
        "no_tests": stats["no_tests"],
        "timeout": stats["timeout"],
        "suspicious": stats["suspicious"],
        "score": score,
        "seconds": seconds,
        "finished": finished,
        "survivors": survivors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module", choices=sorted(MODULES), help="the module to mutate")
    parser.add_argument("--budget", type=int, help="seconds at most (default: the module's own budget)")
    args = parser.parse_args(argv)
    outcome = mutate(args.module, args.budget)
    scores = json.loads(SCORES.read_text()) if SCORES.exists() else {}
    scores[args.module] = {k: v for k, v in outcome.items() if k != "survivors"} | {"survivors": outcome["survivors"]}
    SCORES.write_text(json.dumps(scores, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    print(
        f"{args.module}: {outcome['killed']}/{outcome['mutants']} killed ({outcome['score']} %), "
        f"{outcome['survived']} survived, {outcome['no_tests']} without a test, {outcome['timeout']} timed out, "
        f"{outcome['seconds']} s{'' if outcome['finished'] else ' (budget spent before the last mutant)'}"
    )
    for line in outcome["survivors"]:  # type: ignore[attr-defined]
        print(f"  survived: {line}")
    return 0 if outcome["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
