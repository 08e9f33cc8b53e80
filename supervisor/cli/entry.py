"""The ``openshell-sandbox`` console script and ``python -m supervisor.cli``.

An interpreter started without ``-I`` imports from places its caller chose: ``python -m`` puts the current
directory first on ``sys.path`` (a ``trio.py`` the agent left in its workdir would run as us), and
``PYTHONPATH`` adds its own. When either is the case, this entry re-executes itself isolated on the
installation's import path (supervisor/protocol/interpreter.py) before it imports anything that could come from
them. It imports nothing but that module, which needs only what every interpreter has loaded at start.

What it cannot undo: code the interpreter ran before ours (a ``sitecustomize`` on ``PYTHONPATH``, loader
variables). Those are the caller's own process; nothing we start inherits them.
"""

import os
import sys

from supervisor.protocol.interpreter import CLI_MAIN, import_path, isolated_argv


def exposed() -> bool:
    """Whether this interpreter's import path holds entries its caller chose (see the module docstring)."""
    if sys.flags.isolated:
        return False
    if not sys.flags.ignore_environment and os.environ.get("PYTHONPATH"):
        return True
    if sys.flags.safe_path or not sys.path:
        return False
    script = sys.argv[0] if sys.argv else ""
    if script in ("", "-c") or not os.path.isabs(sys.path[0]):
        return True
    # a script puts its own (resolved) directory first; ``-m`` puts the current directory there instead
    return os.path.realpath(sys.path[0]) != os.path.dirname(os.path.realpath(script))


def run() -> None:
    if exposed():
        argv = isolated_argv(CLI_MAIN, import_path(), *sys.argv[1:])
        sys.stdout.flush()
        os.execv(argv[0], argv)
    from supervisor.cli.main import main

    sys.exit(main())
