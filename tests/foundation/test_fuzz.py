"""Fuzz: malformed cluster files, plans and seed flag strings must fail only with a SpecError that names
a field — never another exception type (thousands of cases per run)."""

from __future__ import annotations

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
from tests.support.fuzz_strategies import mutated, text_edits

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_TEXT = (ROOT / "examples" / "clusters" / "seed-uneven-nodes.yaml").read_text()
CLUSTER_DATA = load_yaml_text(CLUSTER_TEXT, "x")
CLUSTER = parse_cluster(CLUSTER_DATA)
DEMO_CLUSTER = parse_cluster(load_yaml_text((ROOT / "examples/clusters/demo-cpu-6.yaml").read_text(), "x"))
PLAN_DATA = json.loads((ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json").read_text())
FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


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
@given(text_edits(CLUSTER_TEXT))
def test_fuzz_cluster_text(text: str) -> None:
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
