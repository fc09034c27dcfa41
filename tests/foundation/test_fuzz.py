"""Fuzz: malformed cluster files, plans and seed flag strings must fail only with a SpecError that names
a field — never another exception type (thousands of cases per run)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cluster import parse_cluster
from planner.documents import line_of, load_yaml_text, yaml_field_lines
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import plan_from_dict
from planner.seed_flags import plan_from_flags
from planner.validate import validate

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_TEXT = (ROOT / "examples" / "clusters" / "seed-uneven-nodes.yaml").read_text()
CLUSTER_DATA = load_yaml_text(CLUSTER_TEXT, "x")
CLUSTER = parse_cluster(CLUSTER_DATA)
DEMO_CLUSTER = parse_cluster(load_yaml_text((ROOT / "examples/clusters/demo-cpu-6.yaml").read_text(), "x"))
PLAN_DATA = json.loads((ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json").read_text())
FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["a100:0", "r4090:3", "nvlink", "rtx4090", "1f1b", "bf16", "full", "[0, 4]", ""]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=8)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
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


def assert_spec_error(exc: SpecError) -> None:
    assert isinstance(exc.path, str) and isinstance(exc.message, str) and exc.message
    assert str(exc)


@FUZZ
@given(mutated(CLUSTER_DATA))
def test_fuzz_cluster_documents(doc: Any) -> None:
    try:
        parse_cluster(doc)
    except SpecError as exc:
        assert_spec_error(exc)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_cluster_text(data: st.DataObject) -> None:
    text = CLUSTER_TEXT
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 20)))
        text = text[:i] + data.draw(st.text(max_size=6)) + text[j:]
    try:
        parse_cluster(load_yaml_text(text, "fuzz.yaml"))
    except SpecError as exc:
        assert_spec_error(exc)
        line = line_of(yaml_field_lines(text), exc.path)  # what load_cluster adds to the message
        assert line is None or 1 <= line <= text.count("\n") + 1


@FUZZ
@given(mutated(PLAN_DATA))
def test_fuzz_plan_documents(doc: Any) -> None:
    try:
        plan = plan_from_dict(doc)
        validate(plan, DEMO_CLUSTER)
    except SpecError as exc:
        assert_spec_error(exc)


def _garble(valid: str) -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=20), st.builds(
        lambda i, s: valid[:i] + s + valid[i + 1:], st.integers(0, len(valid)), st.text(max_size=3)))


@FUZZ
@given(h=_garble("[[2], [1, 2, 1]]"), lp=_garble("[[4], [1, 2, 1]]"), b=_garble("5 3"), c=_garble("[2, 3]"),
       d=st.one_of(st.none(), _garble("[[[0, 0]], [[1], [1, 1], [1]]]")))
def test_fuzz_seed_flags(h: str, lp: str, b: str, c: str, d: str | None) -> None:
    try:
        plan_from_flags(model=PRESETS["tiny"], cluster=DEMO_CLUSTER, hetero_configs=h, layer_partitions=lp,
                        global_bsz_size=b, chunks=c, devices_id=d)
    except SpecError as exc:
        assert_spec_error(exc)
