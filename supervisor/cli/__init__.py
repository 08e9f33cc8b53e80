"""The ``openshell-sandbox`` command line: the daemons' entrypoint (``main``), the operator subcommands and
their API clients, and dev mode. Nothing under ``control``, ``boundary`` or ``protocol`` imports this package."""

from supervisor.cli.daemon_args import daemon_parser
from supervisor.cli.main import command_parser, main

__all__ = ["command_parser", "daemon_parser", "main"]
