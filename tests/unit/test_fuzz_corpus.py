"""Every input of every fuzz target's corpus (fuzz/corpus/<target>, the findings among them) passes its target:
the corpus doubles as a regression suite, and needs no atheris to run."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.targets import TARGETS, one_input

CORPUS = Path(__file__).resolve().parents[2] / "fuzz" / "corpus"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_corpus_input_passes_its_target(name: str) -> None:
    inputs = sorted((CORPUS / name).iterdir())
    assert inputs, f"fuzz/corpus/{name} is empty: run python -m fuzz.seeds"
    target = one_input(name)
    for path in inputs:
        try:
            target(path.read_bytes())
        except Exception as exc:
            raise AssertionError(f"fuzz/corpus/{name}/{path.name} fails its target: {exc!r}") from exc
