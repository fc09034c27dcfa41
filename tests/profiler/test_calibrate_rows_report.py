"""``hexiscale calibrate`` prints each layer row's device and host time per pass and how many passes are
launch-bound (:mod:`hexiscale.cli.calibrate_rows`): the one GPU run that checks host-free timing
(executor/profiler/timing.py) shows there whether the device came out below the host where it should."""

from __future__ import annotations

from hexiscale.cli.calibrate_rows import row_lines


def test_the_report_names_the_timing_and_counts_the_launch_bound_passes() -> None:
    rows = [{"tp": 1, "micro_batch": 1, "seq_len": 1024, "recompute": "none", "forward_s": 0.5e-3,
             "forward_host_s": 1.2e-3, "backward_s": 1.5e-3, "backward_host_s": 1.2e-3},
            {"tp": 2, "micro_batch": 1, "seq_len": 1024, "recompute": "none", "collectives": True,
             "forward_s": 0.7e-3, "forward_host_s": 1.1e-3, "backward_s": 0.9e-3, "backward_host_s": 1.6e-3}]
    lines = row_lines({"device_times": "full-queue", "layer_rows": rows})
    assert lines[0].startswith("layer rows, device/host ms per pass (device timed from a full queue, host-free): "
                               "3 of 4 passes launch-bound")
    assert lines[1:] == ["  tp1 mb1 s1024 none: fwd 0.50/1.20 bwd 1.50/1.20",
                         "  tp2 mb1 s1024 none live: fwd 0.70/1.10 bwd 0.90/1.60"]
    assert row_lines({"layer_rows": [{k: v for k, v in rows[0].items() if "host" not in k}]}) == []
