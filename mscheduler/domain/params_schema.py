"""Params checked at the door: a task's params against the JSON schema its handler publishes.

A worker publishes, with its registration, the JSON schema of each handler's params model (what
pydantic's ``model_json_schema()`` makes of it); ``Operations.send`` checks the params of a task
sent over the REST API or the CLI against it before anything is written, so a mistyped field is
refused where it is made rather than failing later as ``InvalidParams``.

``schema_problems`` is a validator for the part of JSON Schema (draft 2020-12) that pydantic
writes: ``$ref`` into ``$defs``, ``type``, ``enum``, ``const``, ``properties`` / ``required`` /
``additionalProperties``, ``items`` / ``prefixItems``, ``anyOf`` / ``oneOf`` / ``allOf``, and the
bounds of numbers, strings, arrays and objects. A keyword it does not know (``format``,
``pattern`` flavours, ``not``, ...) accepts: the handler's own model stays the authority, and the
door never refuses what the schema does not say. Values are JSON's: a string ``"42"`` is not an
integer here, even where the model's lax mode would coerce it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

MAX_PROBLEMS = 5
SCHEMA_MAX_BYTES = 64 * 1024  # a published schema larger than this is not stored (no check)
_MAX_DEPTH = 64

_TYPE_WORDS = {
    "object": "an object",
    "array": "an array",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def json_type(value: Any) -> str:
    """The JSON type of a decoded value (an integral float is a number, not an integer here:
    ``_is_type`` accepts it as an integer, as JSON Schema does)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _is_type(value: Any, kind: str) -> bool:
    found = json_type(value)
    if kind == "integer":
        return found == "integer" or (found == "number" and math.isfinite(value) and value == int(value))
    if kind == "number":
        return found in ("integer", "number")
    return found == kind


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _path(path: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in path)


def schema_problems(schema: Mapping[str, Any], value: Any, *, root: str = "params") -> list[tuple[str, str]]:
    """What is wrong with ``value`` under ``schema``: (field path, why) pairs, at most
    ``MAX_PROBLEMS``; empty when it conforms. Paths start at ``root`` (``params.order_id``,
    ``params.items.2.sku``)."""
    checker = _Checker(schema)
    checker.check(schema, value, (root,), 0)
    return checker.problems[:MAX_PROBLEMS]


class _Checker:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.problems: list[tuple[str, str]] = []

    def fail(self, path: tuple[str | int, ...], why: str) -> None:
        self.problems.append((_path(path), why))

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = self.root
        for part in ref[2:].split("/"):
            target = (
                target.get(part.replace("~1", "/").replace("~0", "~"))
                if isinstance(target, Mapping)
                else None
            )
        if not isinstance(target, Mapping):
            return {}  # a reference it cannot follow says nothing: accepted
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return {**target, **rest} if rest else target

    def conforms(self, schema: Any, value: Any, path: tuple[str | int, ...], depth: int) -> bool:
        """Whether ``value`` conforms, without recording problems."""
        trial = _Checker(self.root)
        trial.check(schema, value, path, depth)
        return not trial.problems

    def check(self, schema: Any, value: Any, path: tuple[str | int, ...], depth: int) -> None:
        if not isinstance(schema, Mapping) or depth > _MAX_DEPTH or len(self.problems) >= MAX_PROBLEMS:
            return  # ``true``, ``{}`` or something unknown: anything goes
        schema = self.resolve(schema)
        if not self.check_choice(schema, value, path, depth):
            return
        kinds = schema.get("type")
        if isinstance(kinds, str):
            kinds = [kinds]
        if isinstance(kinds, list) and kinds and not any(_is_type(value, k) for k in kinds):
            wanted = " or ".join(_TYPE_WORDS.get(k, str(k)) for k in kinds)
            self.fail(path, f"expected {wanted}, got {json_type(value)} {_shown(value)}")
            return
        if "const" in schema and value != schema["const"]:
            self.fail(path, f"expected {_shown(schema['const'])}, got {_shown(value)}")
            return
        choices = schema.get("enum")
        if isinstance(choices, list) and value not in choices:
            self.fail(path, f"expected one of {', '.join(_shown(c) for c in choices)}, got {_shown(value)}")
            return
        if isinstance(value, Mapping):
            self.check_object(schema, value, path, depth)
        elif isinstance(value, (list, tuple)):
            self.check_array(schema, value, path, depth)
        elif isinstance(value, str):
            self.check_string(schema, value, path)
        elif json_type(value) in ("integer", "number"):
            self.check_number(schema, value, path)

    def check_choice(
        self, schema: Mapping[str, Any], value: Any, path: tuple[str | int, ...], depth: int
    ) -> bool:
        """``allOf`` (each), ``anyOf`` / ``oneOf`` (at least one: pydantic's unions are tried in
        turn, so one that matches is enough); False when a problem was recorded."""
        before = len(self.problems)
        for part in schema.get("allOf") or ():
            self.check(part, value, path, depth + 1)
        for word in ("anyOf", "oneOf"):
            options = schema.get(word)
            if isinstance(options, list) and options:
                if not any(self.conforms(option, value, path, depth + 1) for option in options):
                    kinds = sorted(
                        {k for o in options if isinstance(t := self.resolve(o).get("type"), str) for k in [t]}
                    )
                    hint = f" ({' or '.join(_TYPE_WORDS.get(k, k) for k in kinds)})" if kinds else ""
                    self.fail(
                        path,
                        f"matches none of the allowed forms{hint}, got {json_type(value)} {_shown(value)}",
                    )
        return len(self.problems) == before

    def check_object(
        self, schema: Mapping[str, Any], value: Mapping[str, Any], path: tuple[str | int, ...], depth: int
    ) -> None:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        for name in schema.get("required") or ():
            if name not in value:
                self.fail((*path, name), "a required field is missing")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                self.check(properties[name], item, (*path, name), depth + 1)
            elif extra is False:
                self.fail((*path, name), "not a field of this handler's params")
            elif isinstance(extra, Mapping):
                self.check(extra, item, (*path, name), depth + 1)
        self.check_count(schema, len(value), path, "minProperties", "maxProperties", "field")

    def check_array(
        self,
        schema: Mapping[str, Any],
        value: list[Any] | tuple[Any, ...],
        path: tuple[str | int, ...],
        depth: int,
    ) -> None:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        for i, item in enumerate(value):
            if i < len(prefix):
                self.check(prefix[i], item, (*path, i), depth + 1)
            elif "items" in schema:
                if schema["items"] is False:
                    self.fail((*path, i), f"at most {len(prefix)} items")
                    break
                self.check(schema["items"], item, (*path, i), depth + 1)
        self.check_count(schema, len(value), path, "minItems", "maxItems", "item")

    def check_count(
        self,
        schema: Mapping[str, Any],
        count: int,
        path: tuple[str | int, ...],
        low: str,
        high: str,
        unit: str,
    ) -> None:
        least, most = schema.get(low), schema.get(high)
        if isinstance(least, int) and count < least:
            self.fail(path, f"at least {least} {unit}(s), got {count}")
        if isinstance(most, int) and count > most:
            self.fail(path, f"at most {most} {unit}(s), got {count}")

    def check_string(self, schema: Mapping[str, Any], value: str, path: tuple[str | int, ...]) -> None:
        self.check_count(schema, len(value), path, "minLength", "maxLength", "character")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            try:
                matched = re.search(pattern, value) is not None
            except re.error:
                matched = True  # a pattern Python cannot read says nothing here
            if not matched:
                self.fail(path, f"does not match the pattern {pattern!r}: {_shown(value)}")

    def check_number(self, schema: Mapping[str, Any], value: float, path: tuple[str | int, ...]) -> None:
        holds: dict[str, Callable[[float], bool]] = {
            "minimum": lambda bound: value >= bound,
            "exclusiveMinimum": lambda bound: value > bound,
            "maximum": lambda bound: value <= bound,
            "exclusiveMaximum": lambda bound: value < bound,
        }
        says = {"minimum": "at least", "exclusiveMinimum": "greater than", "maximum": "at most"}
        for word, test in holds.items():
            bound: Any = schema.get(word)
            if json_type(bound) in ("integer", "number") and not test(bound):
                self.fail(path, f"must be {says.get(word, 'less than')} {bound}, got {_shown(value)}")
        step: Any = schema.get("multipleOf")
        if json_type(step) in ("integer", "number") and step > 0:
            ratio = value / step
            if not math.isclose(ratio, round(ratio)):
                self.fail(path, f"must be a multiple of {step}, got {_shown(value)}")
