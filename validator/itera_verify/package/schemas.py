"""The JSON Schemas: shipped inside the wheel as `itera_verify/schemas/`, read from `schemas/` in a checkout."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path


NAMES = ("manifest", "stops", "reload", "params", "report")


def schema_dir() -> Path:
    installed = Path(__file__).resolve().parents[1] / "schemas"  # itera_verify/schemas in the wheel
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[3] / "schemas"  # editable install: the repository's schemas/


# jsonschema and referencing are imported where used: beside a seal only the checks' child needs them, and the
# command's start (before the seal's first frame) does not wait for them.
@lru_cache(maxsize=None)
def _registry():
    from referencing import Registry, Resource

    resources = []
    for name in NAMES:
        schema = json.loads((schema_dir() / f"{name}.schema.json").read_text(encoding="utf-8"))
        resource = Resource.from_contents(schema)
        resources += [(schema["$id"], resource), (f"{name}.schema.json", resource)]
    return Registry().with_resources(resources)


@lru_cache(maxsize=None)
def validator(name: str):
    from jsonschema import Draft202012Validator

    schema = json.loads((schema_dir() / f"{name}.schema.json").read_text(encoding="utf-8"))
    return Draft202012Validator(schema, registry=_registry())
