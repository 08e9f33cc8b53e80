"""Cut a compiled OCSF schema down to the classes the daemons emit (how ``schema-1.7.0.json`` was made).

Input: the output of ``ocsf-schema-compiler`` on a checkout of the ``ocsf/ocsf-schema`` repository at a tag.
Output: those classes, every object they reach, and the dictionary's types, without the prose (``description``,
``references``) that makes the full schema megabytes: what a validator needs and nothing else.

    python tests/ocsf/trim_schema.py compiled.json > tests/ocsf/schema-1.7.0.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

CLASSES = ("network_activity", "http_activity", "device_config_state_change", "process_activity", "detection_finding")
_PROSE = ("description", "references", "source", "@deprecated")


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in _PROSE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def trim(compiled: dict[str, Any]) -> dict[str, Any]:
    classes = {name: _strip(compiled["classes"][name]) for name in CLASSES}
    objects: dict[str, Any] = {}
    pending = [a for c in classes.values() for a in c["attributes"].values()]
    while pending:
        attribute = pending.pop()
        name = attribute.get("object_type")
        if name is None or name in objects:
            continue
        objects[name] = _strip(compiled["objects"][name])
        pending.extend(objects[name].get("attributes", {}).values())
    return {
        "version": compiled["version"],
        "classes": classes,
        "objects": dict(sorted(objects.items())),
        "types": _strip(compiled["dictionary"]["types"]["attributes"]),
    }


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        json.dump(trim(json.load(f)), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
