"""The ``openshell-sandbox`` command line: the daemons' entrypoint (``main.main``), the operator subcommands and
their API clients, and dev mode. Nothing under ``control``, ``boundary`` or ``protocol`` imports this package.

Importing the package imports nothing else (``entry.py`` must run before any module a caller's path could
shadow); the parsers below load on first use.
"""

__all__ = ["command_parser", "daemon_parser"]


def __getattr__(name: str) -> object:
    if name == "daemon_parser":
        from supervisor.cli.daemon_args import daemon_parser

        return daemon_parser
    if name == "command_parser":
        from supervisor.cli.main import command_parser

        return command_parser
    raise AttributeError(name)
