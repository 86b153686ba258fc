"""The one formatter of pydantic validation errors (watermark/validation.py)."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import AfterValidator, BaseModel, Field, ValidationError, model_validator

from watermark.validation import describe, error_lines, first_error, summary


def _positive(value: int) -> int:
    if value < 0:
        raise ValueError("must be positive")
    return value


class Inner(BaseModel):
    mode: Literal["a", "b"] = "a"


class Model(BaseModel):
    count: Annotated[int, AfterValidator(_positive)] | str = 0
    size: int = Field(default=0, ge=0)
    inner: Inner = Inner()
    items: list[int] = []

    @model_validator(mode="after")
    def _not_both(self) -> "Model":
        if self.size == 7 and self.inner.mode == "b":
            raise ValueError("size 7 needs mode a")
        return self


def _error(**fields: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Model.model_validate(fields)
    return caught.value


def test_lines_name_the_field_path_and_drop_validator_tags():
    lines = error_lines(_error(count=None, inner={"mode": "hunter2"}, items=[1, "x"]))
    # The failing union member's validator tag ("function-after[...]") is no field name.
    assert lines[0] == "count: Input should be a valid integer"
    assert lines[1] == "count.str: Input should be a valid string"
    assert lines[2] == "inner.mode: Input should be 'a' or 'b'"
    assert lines[3].startswith("items.1: Input should be a valid integer")
    assert not any("hunter2" in line or "[" in line for line in lines)


def test_an_error_without_location_takes_the_default_name():
    exc = _error(size=7, inner={"mode": "b"})
    assert error_lines(exc, default="spec") == ["spec: Value error, size 7 needs mode a"]
    assert error_lines(exc, default="", plain=True) == ["size 7 needs mode a"]
    assert describe(exc, default="spec") == "spec: Value error, size 7 needs mode a"


def test_skip_drops_location_parts():
    errors = [{"loc": ("body", "size"), "msg": "bad"}, {"loc": ("body",), "msg": "worse"}]
    assert error_lines(errors, default="body", skip=("body",)) == ["size: bad", "body: worse"]


def test_summary_joins_distinct_lines_up_to_the_limit():
    errors = [{"loc": ("a",), "msg": "bad"}, {"loc": ("a",), "msg": "bad"}, {"loc": ("b",), "msg": "bad"},
              {"loc": ("c",), "msg": "bad"}]
    assert summary(errors) == "a: bad; b: bad; c: bad"
    assert summary(errors, limit=2) == "a: bad; b: bad"


def test_first_error_is_where_and_what():
    assert first_error(_error(size=-1)) == ("size", "Input should be greater than or equal to 0")
    assert first_error(_error(count=None))[0] == "count"
