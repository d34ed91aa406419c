"""Documents that a JSON Schema allows, as a Hypothesis strategy: just the keywords the
protocol's published schema (docs/protocol.schema.json) uses, so that a keyword the protocol
starts using and this does not know fails loudly instead of being ignored."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

KNOWN = {"type", "properties", "required", "items", "anyOf", "$ref", "const", "minimum", "maximum", "exclusiveMinimum",
         "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "maxProperties", "additionalProperties", "propertyNames",
         "pattern", "title", "description", "default", "$defs", "enum"}
# Big enough to cover a real node (8 GPUs, 8 ports), small enough to keep examples quick.
MAX_ITEMS = 4


def from_json_schema(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> st.SearchStrategy:
    defs = schema.get("$defs", {}) if defs is None else defs
    unknown = set(schema) - KNOWN
    if unknown:
        raise NotImplementedError(f"schema keywords {sorted(unknown)} not handled by this strategy")
    if "$ref" in schema:
        return st.deferred(lambda: from_json_schema(defs[schema["$ref"].rsplit("/", 1)[1]], defs))
    if "anyOf" in schema:
        return st.one_of([from_json_schema(s, defs) for s in schema["anyOf"]])
    if "const" in schema or "enum" in schema:
        return st.sampled_from([schema["const"]] if "const" in schema else schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))
    if kind == "number":
        return st.floats(min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
                         max_value=schema.get("maximum", schema.get("exclusiveMaximum")),
                         exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema,
                         allow_nan=False, allow_infinity=False)
    if kind == "string":
        return _string(schema)
    if kind == "array":
        return st.lists(from_json_schema(schema["items"], defs), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS))
    if kind == "object":
        return _object(schema, defs)
    raise NotImplementedError(f"schema {schema} not handled by this strategy")


def _string(schema: dict[str, Any]) -> st.SearchStrategy:
    if "pattern" in schema and _FIXED.fullmatch(schema["pattern"]):  # "^[0-9a-f]{64}$": filtering text would never hit it
        return st.from_regex(schema["pattern"][:-1] + r"\Z", fullmatch=True)
    text = st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 40), 40))
    return text.filter(_matcher(schema["pattern"])) if "pattern" in schema else text


_FIXED = re.compile(r"\^\[[0-9A-Za-z-]+\]\{[0-9]+\}\$")


def _matcher(pattern: str):
    # A JSON Schema pattern is searched for, and its "$" is the end of the string; Python's
    # "$" also matches before a final newline, "\\Z" does not.
    return re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern).search


def _object(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy:
    if "additionalProperties" in schema and "properties" not in schema:
        keys = from_json_schema({"type": "string", **schema.get("propertyNames", {})}, defs)
        return st.dictionaries(keys, from_json_schema(schema["additionalProperties"], defs),
                               max_size=min(schema.get("maxProperties", MAX_ITEMS), MAX_ITEMS))
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    return st.fixed_dictionaries(
        {k: from_json_schema(v, defs) for k, v in properties.items() if k in required},
        optional={k: from_json_schema(v, defs) for k, v in properties.items() if k not in required},
    )
