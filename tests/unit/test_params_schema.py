"""The door's validator against what pydantic's schemas say: nested models (``$ref``), tuples
(``prefixItems``), unions, bounds, extra fields of a ``forbid`` model; a keyword it does not
know accepts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from mscheduler.domain.params_schema import schema_problems


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str
    zip_code: str = Field(pattern=r"^\d{5}$")


class Order(BaseModel):
    id: int
    ship_to: Address
    size: tuple[int, int] = (1, 1)
    weight: float = Field(0, gt=0, le=100)
    tags: list[str] = Field(default_factory=list, max_length=2)
    ref: int | str | None = None


SCHEMA = Order.model_json_schema()
GOOD: dict[str, Any] = {"id": 1, "ship_to": {"city": "Ulm", "zip_code": "89073"}, "weight": 2.5}


@pytest.mark.parametrize(
    "params",
    [
        GOOD,
        GOOD | {"id": 3.0},  # an integral number is an integer in JSON Schema
        GOOD | {"size": [2, 3], "tags": ["a"], "ref": "r-1"},
        GOOD | {"ref": None},
        GOOD | {"unknown": 1},  # Order ignores extra fields, so the schema allows them
    ],
)
def test_what_the_model_accepts_passes(params: dict[str, Any]) -> None:
    Order.model_validate(params)
    assert schema_problems(SCHEMA, params) == []


@pytest.mark.parametrize(
    ("params", "field", "why"),
    [
        (GOOD | {"id": True}, "params.id", "expected an integer, got boolean true"),
        (GOOD | {"ship_to": {"city": "Ulm", "zip_code": "ABC"}}, "params.ship_to.zip_code", "pattern"),
        (GOOD | {"ship_to": {"city": "Ulm", "zip_code": "89073", "x": 1}}, "params.ship_to.x", "not a field"),
        (GOOD | {"size": [1, "2"]}, "params.size.1", "expected an integer"),
        (GOOD | {"weight": 0}, "params.weight", "must be greater than 0"),
        (GOOD | {"weight": 101}, "params.weight", "must be at most 100"),
        (GOOD | {"tags": ["a", "b", "c"]}, "params.tags", "at most 2 item(s), got 3"),
        (GOOD | {"ref": 1.5}, "params.ref", "matches none of the allowed forms"),
    ],
)
def test_what_the_model_refuses_is_named_by_its_path(params: dict[str, Any], field: str, why: str) -> None:
    problems = schema_problems(SCHEMA, params)
    assert problems and problems[0][0] == field and why in problems[0][1], problems


def test_keywords_it_does_not_know_accept() -> None:
    assert schema_problems({"type": "string", "format": "no-such-format", "not": {}}, "x") == []
    assert schema_problems({"$ref": "#/$defs/missing"}, 5) == []
    assert schema_problems(True, 5) == []  # type: ignore[arg-type]
