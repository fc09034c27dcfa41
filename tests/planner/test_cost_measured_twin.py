"""A cluster that names a spec GPU type is estimated with that type's measured profile once the
profiler has written one (``<key>-measured``); spec types without one stay on the roofline."""

from __future__ import annotations

from planner.cost import ProfileSet
from planner.cost.measured import MeasuredProfile
from planner.cost.profile import SpecProfile


def test_spec_type_uses_its_measured_twin() -> None:
    profiles = ProfileSet()
    assert isinstance(profiles.get("h100-sxm"), MeasuredProfile)
    assert isinstance(profiles.get("rtx4090"), SpecProfile)  # no measured twin: roofline
    assert isinstance(ProfileSet(prefer_measured=False).get("h100-sxm"), SpecProfile)


def test_twin_and_spec_disagree_so_the_choice_matters() -> None:
    from planner.model import PRESETS

    m = PRESETS["llama-1.3b"]
    kw = dict(model=m, micro_batch=2, seq_len=2048, tp=1, dtype="bf16", recompute="none")
    measured = ProfileSet().get("h100-sxm")
    spec = ProfileSet(prefer_measured=False).get("h100-sxm")
    t_measured = measured.layer_time(**kw)
    t_spec = spec.layer_time(**kw)
    assert t_measured != t_spec
