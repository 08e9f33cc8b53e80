"""docs/manifests is exactly what ``k8s render`` writes for the documented example, and the commands in the
operator docs match the real program.

scripts/render-doc-manifests.sh regenerates docs/manifests; the first test runs it into a temporary directory
and compares, so an edit by hand or a change to render without regenerating fails here. Every daemon command line
in those files parses with ``supervisor.cli.daemon_parser()``, and every ``openshell-sandbox`` command shown in
docs/quickstart.md and docs/kubernetes.md parses with the CLI's own parsers. What the objects contain is tested
on render itself (tests/unit/test_k8s_render.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from supervisor.cli import command_parser, daemon_parser

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "docs" / "manifests"
SCRIPT = ROOT / "scripts" / "render-doc-manifests.sh"
DOCS_WITH_COMMANDS = (ROOT / "docs" / "quickstart.md", ROOT / "docs" / "kubernetes.md")
MODELS = ("r", "u", "p")
FILES = (*(f"model-{m}.yaml" for m in MODELS), "proxy-pod.yaml")


def test_docs_manifests_are_a_fresh_render(tmp_path: Path) -> None:
    env = {**os.environ, "OPENSHELL_SANDBOX": f"{sys.executable} -m supervisor.cli", "PYTHONPATH": str(ROOT)}
    subprocess.run(["bash", str(SCRIPT), str(tmp_path)], cwd=ROOT, env=env, check=True, timeout=120)
    rendered = sorted(p.name for p in tmp_path.iterdir())
    assert rendered == sorted(FILES)
    for name in rendered:
        want = (tmp_path / name).read_text()
        assert (MANIFESTS / name).read_text() == want, f"docs/manifests/{name} is stale: run {SCRIPT.name}"
    assert sorted(p.name for p in MANIFESTS.iterdir()) == sorted([*rendered, "policy.yaml"])


@pytest.mark.parametrize("name", FILES)
def test_every_daemon_command_line_in_the_manifests_parses_with_the_real_flags(name: str) -> None:
    docs = [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]
    model = name.removeprefix("model-").removesuffix(".yaml")
    seen = 0
    for doc in docs:
        if doc["kind"] not in ("Pod", "Deployment"):
            continue
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
        for container in spec["containers"]:
            if "args" not in container:  # the proxy-pod workload: the agent's own argv, nothing of ours
                assert name == "proxy-pod.yaml" and container["command"][0] == "python3"
                continue
            assert container["command"] == ["/usr/local/bin/openshell-sandbox"]
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    args = daemon_parser().parse_args(container["args"])
                except SystemExit:
                    pytest.fail(f"{name} {container['name']}: {container['args']}: {err.getvalue()}")
            assert args.privilege_model == model.upper() or args.mode == "control"
            assert (args.topology == "proxy-pod") == (name == "proxy-pod.yaml") or args.mode == "boundary"
            seen += 1
    assert seen == (1 if name == "proxy-pod.yaml" else 2)


# -- commands shown in the docs -----------------------------------------------------------------------------------


_OPERATOR = re.compile(r"^[|;&<>()]+$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _shell_words(text: str) -> list[str]:
    """The words of the first simple command in a shell line: stops at ``|``, ``;``, ``&&``, ``>``, ``#``…"""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for word in lexer:
        if _OPERATOR.match(word):
            if word[0] in "<>" and words and words[-1].isdigit():
                words.pop()  # the fd of 2>FILE
            break
        words.append(word)
    return words


def _doc_commands(path: Path) -> list[list[str]]:
    """``openshell-sandbox …`` commands in a Markdown file's code blocks, also after ``$``, ``VAR=…`` and
    ``kubectl … exec … --``; backslash continuations are joined."""
    commands = []
    in_block = False
    pending = ""
    for line in path.read_text().splitlines():
        if line.strip().startswith("```"):
            in_block = not in_block
            pending = ""
            continue
        if not in_block:
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        words = _shell_words(text.removeprefix("$ "))
        while words and _ASSIGNMENT.match(words[0]):
            words.pop(0)
        if words[:1] == ["kubectl"] and "exec" in words and "--" in words:
            words = words[words.index("--") + 1 :]
        if words[:1] == ["openshell-sandbox"]:
            commands.append(words[1:])
    return commands


def test_doc_command_extraction_stops_at_shell_operators_outside_quotes() -> None:
    words = _shell_words("openshell-sandbox exec -- sh -c 'id; echo x >&2 | cat' >out 2>err")
    assert words == ["openshell-sandbox", "exec", "--", "sh", "-c", "id; echo x >&2 | cat"]


@pytest.mark.parametrize("path", DOCS_WITH_COMMANDS, ids=lambda p: p.name)
def test_every_command_in_the_docs_parses_with_the_cli(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path.name} not written yet")
    commands = _doc_commands(path)
    assert commands, f"{path.name} shows no openshell-sandbox command"
    for argv in commands:
        head = argv[: argv.index("--")] if "--" in argv else argv
        parser = daemon_parser() if any(a.startswith("--mode") for a in head) else command_parser()
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                parser.parse_args(argv)
            except SystemExit as exc:
                if exc.code != 0:
                    pytest.fail(f"{path.name}: `openshell-sandbox {shlex.join(argv)}` does not parse: {err.getvalue()}")
