"""Coverage-guided fuzz targets for the parsers the agent or a peer can reach (docs/design.md "Testing").

``fuzz/targets/<name>.py`` holds one target: ``one_input(data)`` returns for any input the parser handles as
designed (parsed or refused) and raises for anything else — an unexpected exception, or an ``AssertionError``
from the target's oracle. ``fuzz/run.py`` drives atheris (libFuzzer) over ``fuzz/corpus/<name>``.
"""
