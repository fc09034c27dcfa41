"""Strict readers for JSON/YAML mappings: unknown keys, missing keys and wrong types are
``SpecError`` s naming the field path. Shared by the cluster, model and plan loaders."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from planner.errors import SpecError


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def expect_mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"expected a mapping, got {type(value).__name__}", "write key: value pairs")
    for key in value:
        if not isinstance(key, str):
            raise SpecError(path, f"key {key!r} is not a string", "quote the key")
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise SpecError(path, f"expected a list, got {type(value).__name__}", "write a [ ... ] list")
    return list(value)


def check_keys(
    data: Mapping[str, Any], path: str, required: Iterable[str], optional: Iterable[str] = ()
) -> None:
    required = list(required)
    allowed = set(required) | set(optional)
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"allowed keys: {', '.join(sorted(allowed))}"
            raise SpecError(join(path, key), "unknown key", hint)
    for key in required:
        if key not in data:
            raise SpecError(join(path, key), "missing required key", f"add '{key}: ...'")


_EXPONENT = re.compile(r"([-+]?[0-9][0-9_]*(?:\.[0-9_]*)?)[eE]([-+]?[0-9]+)")
_YAML11_FLOAT = re.compile(r"[-+]?[0-9][0-9_]*\.[0-9_]*[eE][-+][0-9]+")  # PyYAML's form of an exponent


def _text_number(value: Any, integer: bool) -> tuple[str, str] | None:
    """(message, hint) for a number written as text (``None`` when ``value`` is no such text): ``3e2``,
    which YAML 1.1 (PyYAML) reads as text because an exponent needs a dot in the mantissa and a
    sign (``3.0e+2``), or a number in quotes."""
    what = "an integer" if integer else "a number"
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        number = float(text.replace("_", ""))
    except ValueError:
        return None
    if number != number or number in (float("inf"), float("-inf")):
        return None
    if integer and not number.is_integer():
        return None
    exponent = _EXPONENT.fullmatch(text)
    if exponent is None or _YAML11_FLOAT.fullmatch(text):
        return f"expected {what}, got the text {value!r}", f"write {text} without quotes"
    mantissa, power = exponent.groups()
    fixes = [f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(power):+d}"]
    if number.is_integer() and abs(number) < 1e15:
        fixes = [str(int(number))] + ([] if integer else fixes)
    return (f"expected {what}, got the text {value!r}: YAML 1.1 reads an exponent as text unless the mantissa "
            "has a dot and the exponent a sign", f"write {' or '.join(fixes)}")


def get_int(data: Mapping[str, Any], key: str, path: str, *, minimum: int | None = None,
            default: int | None = None, maximum: int | None = None) -> int:
    p = join(path, key)
    if key not in data:
        if default is None:
            raise SpecError(p, "missing required key", f"add '{key}: <integer>'")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        text = _text_number(value, integer=True)
        if text is not None:
            raise SpecError(p, *text)
        raise SpecError(p, f"expected an integer, got {value!r}", "write a whole number")
    if minimum is not None and value < minimum:
        raise SpecError(p, f"must be >= {minimum}, got {value}", f"use a value of at least {minimum}")
    if maximum is not None and value > maximum:
        raise SpecError(p, f"must be <= {maximum}, got {value}", f"use a value of at most {maximum}")
    return value


def get_float(data: Mapping[str, Any], key: str, path: str, *, positive: bool = False,
              nonnegative: bool = False, default: float | None = None) -> float:
    p = join(path, key)
    if key not in data:
        if default is None:
            raise SpecError(p, "missing required key", f"add '{key}: <number>'")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        text = _text_number(value, integer=False)
        if text is not None:
            raise SpecError(p, *text)
        raise SpecError(p, f"expected a number, got {value!r}", "write a number such as 25 or 1.5")
    try:
        value = float(value)
    except OverflowError:
        raise SpecError(p, "number too large", "write a realistic value") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SpecError(p, f"must be finite, got {value}", "write a finite number")
    if positive and value <= 0:
        raise SpecError(p, f"must be > 0, got {value}", "use a positive value")
    if nonnegative and value < 0:
        raise SpecError(p, f"must be >= 0, got {value}", "use zero or a positive value")
    return value


def get_str(data: Mapping[str, Any], key: str, path: str, *, default: str | None = None,
            choices: Iterable[str] | None = None) -> str:
    p = join(path, key)
    if key not in data:
        if default is None:
            raise SpecError(p, "missing required key", f"add '{key}: <text>'")
        return default
    value = data[key]
    if not isinstance(value, str) or not value:
        raise SpecError(p, f"expected a non-empty string, got {value!r}", "write a name in quotes")
    if choices is not None:
        options = list(choices)
        if value not in options:
            raise SpecError(p, f"{value!r} is not one of {options}", f"use one of: {', '.join(options)}")
    return value


def get_bool(data: Mapping[str, Any], key: str, path: str, *, default: bool) -> bool:
    if key not in data:
        return default
    value = data[key]
    if not isinstance(value, bool):
        raise SpecError(join(path, key), f"expected true or false, got {value!r}", "write true or false")
    return value
