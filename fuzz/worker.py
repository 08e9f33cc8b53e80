"""One libFuzzer process for one target: ``python -m fuzz.worker NAME [libFuzzer flags and corpus dirs]``.

Run by ``fuzz/run.py``; the target and the packages it parses with are imported under atheris'
instrumentation, so coverage guides the mutations."""

from __future__ import annotations

import importlib
import shlex
import sys

import atheris

from fuzz.targets import TARGETS


def main() -> None:
    name = sys.argv[1]
    target = TARGETS[name]
    with atheris.instrument_imports(include=list(target.instrument)):
        module = importlib.import_module(target.module)
    # libFuzzer runs argv[0] through the shell for -merge and -fork: make it this worker's own command line
    command = f"{shlex.quote(sys.executable)} -m fuzz.worker {shlex.quote(name)}"
    atheris.Setup([command, *sys.argv[2:]], module.one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
