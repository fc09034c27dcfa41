"""Hypothesis strategies shared by the fuzz suites: arbitrary JSON/YAML-like values, structural
mutations of a valid document, and small text edits of a valid file."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["a100:0", "r4090:3", "nvlink", "rtx4090", "1f1b", "bf16", "full", "[0, 4]", "", "[/x]",
                     "../../x", "$(touch x)"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=8)


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys and indices) into a nested document, the root included."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """``base`` with one to four edits: a value replaced, deleted, added, or set to a small integer."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(paths(doc)))
        action = draw(st.sampled_from(["set", "delete", "add", "int"]))
        if not path:
            if action == "set":
                doc = draw(values)
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        if action == "set":
            parent[key] = draw(values)
        elif action == "int":
            parent[key] = draw(st.integers(-3, 70))
        elif action == "delete":
            del parent[key]
        elif isinstance(parent[key], dict):
            parent[key][draw(st.text(max_size=8))] = draw(values)
        elif isinstance(parent[key], list):
            parent[key].append(draw(values))
    return doc


@st.composite
def text_edits(draw: st.DrawFn, text: str, span: int = 20) -> str:
    """``text`` with one to three short spans replaced by random text."""
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + span)))
        text = text[:i] + draw(st.text(max_size=6)) + text[j:]
    return text
