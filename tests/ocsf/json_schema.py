"""JSON Schema for one OCSF class, built from the vendored compiled schema (``schema-1.7.0.json``).

What it checks, per class and for the profiles an event declares (``metadata.profiles``):

* every attribute is one the class (or object) defines — no invented or misspelt names (``additionalProperties``
  is false, except for ``unmapped`` and the other free-form ``object`` attributes);
* the attribute's type: its base JSON type, the dictionary type's regex, a ``port_t``'s range, arrays;
* enumerated ``*_id`` attributes take only their listed values;
* ``required`` attributes are present, and each object's ``at_least_one`` constraint holds;
* ``class_uid``, ``category_uid`` and ``type_uid`` agree with the class and the activity.

What it does not: sibling captions (``activity_name`` against ``activity_id``), deprecation, or observables.
An attribute gated by a profile the event does not declare is refused, as the OCSF server's validator does.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("schema-1.7.0.json")
_BASE = {"string_t": "string", "integer_t": "integer", "long_t": "integer", "float_t": "number",
         "boolean_t": "boolean", "json_t": None}  # fmt: skip


@cache
def compiled() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


def class_by_uid(uid: int) -> dict[str, Any]:
    return next(c for c in compiled()["classes"].values() if c["uid"] == uid)


def _scalar(type_name: str) -> dict[str, Any]:
    types = compiled()["types"]
    schema: dict[str, Any] = {}
    while type_name not in _BASE:
        t = types[type_name]
        if "regex" in t and "pattern" not in schema:
            schema["pattern"] = t["regex"]
        if "range" in t:
            schema["minimum"], schema["maximum"] = t["range"]
        if "max_len" in t:
            schema["maxLength"] = t["max_len"]
        type_name = t["type"]
    if _BASE[type_name] is not None:
        schema["type"] = _BASE[type_name]
    return schema


def _allowed(attribute: dict[str, Any], profiles: frozenset[str]) -> bool:
    gate = attribute.get("profiles")
    return not gate or any(p in profiles for p in gate)


def _attributes(definition: dict[str, Any], profiles: frozenset[str], defs: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, attribute in definition["attributes"].items():
        if not _allowed(attribute, profiles):
            continue
        if attribute["type"] == "object_t":
            _object(attribute["object_type"], profiles, defs)
            one: dict[str, Any] = {"$ref": f"#/$defs/{attribute['object_type']}"}
        else:
            one = _scalar(attribute["type"])
            if "enum" in attribute:
                kind = "integer" if one.get("type") == "integer" else "string"
                one["enum"] = [int(k) if kind == "integer" else k for k in attribute["enum"]]
        props[name] = {"type": "array", "items": one} if attribute.get("is_array") else one
        if attribute.get("requirement") == "required":
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if definition["attributes"]:
        schema["additionalProperties"] = False
    at_least_one = (definition.get("constraints") or {}).get("at_least_one")
    if at_least_one:
        schema["anyOf"] = [{"required": [name]} for name in at_least_one if name in props]
    return schema


def _object(name: str, profiles: frozenset[str], defs: dict[str, Any]) -> None:
    if name in defs:
        return
    defs[name] = {}  # recursion guard (process.parent_process)
    defs[name] = _attributes(compiled()["objects"][name], profiles, defs)


def class_schema(uid: int, profiles: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The JSON Schema an event of class ``uid`` declaring ``profiles`` must satisfy."""
    definition = class_by_uid(uid)
    defs: dict[str, Any] = {}
    schema = _attributes(definition, profiles, defs)
    activities = [int(k) for k in definition["attributes"]["activity_id"]["enum"]]
    schema["properties"]["class_uid"] = {"const": uid}
    schema["properties"]["category_uid"] = {"const": uid // 1000}
    schema["properties"]["type_uid"] = {"enum": [uid * 100 + a for a in activities]}
    schema["$defs"] = defs
    return schema
