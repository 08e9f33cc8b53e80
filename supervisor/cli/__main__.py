"""``python -m supervisor.cli``: the same entrypoint as the ``openshell-sandbox`` console script."""

from supervisor.cli.entry import run

run()
