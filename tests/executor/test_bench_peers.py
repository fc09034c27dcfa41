"""The peers benchmark's pure parts: config names, the cluster file it writes, the ratios it reports."""

from __future__ import annotations

import pytest

from benchmarks.executor.peers import cluster_yaml, parse_config, ratios
from planner.cluster import parse_cluster
from planner.documents import load_yaml_text


def test_config_names() -> None:
    assert parse_config("ours-1") == ("ours", 1, 1, 1, 0)
    assert parse_config("mcore-4-tp2-pp1-mb2") == ("mcore", 4, 2, 1, 2)
    assert parse_config("titan-4-tp2") == ("titan", 4, 2, 1, 0)
    for bad in ("ours", "deepspeed-4", "titan-4-pp2-tp2", "ours-4-mb"):
        with pytest.raises(ValueError, match="expected ours"):
            parse_config(bad)


@pytest.mark.parametrize("key", ["h100-sxm-measured", "h200-measured"])
def test_cluster_file_is_a_valid_four_gpu_host(key: str) -> None:
    spec = parse_cluster(load_yaml_text(cluster_yaml(key, 67.9), "peers_cluster.yaml"))
    assert spec.num_devices == 4
    assert {d.memory_gib for d in spec.devices} == {68}
    assert {d.gpu for d in spec.devices} == {key}


def test_ratios_take_each_systems_best_config_per_gpu_count() -> None:
    rows = [{"system": "ours", "gpus": 4, "tokens_per_s": 90.0}, {"system": "ours", "gpus": 4, "tokens_per_s": 99.0},
            {"system": "titan", "gpus": 4, "tokens_per_s": 110.0}, {"system": "titan", "gpus": 4, "tokens_per_s": 90.0},
            {"system": "mcore", "gpus": 4, "error": "oom"}, {"system": "ours", "gpus": 1, "tokens_per_s": 50.0},
            {"system": "mcore", "gpus": 1, "tokens_per_s": 40.0}]
    assert ratios(rows) == {"ours_over_titan_4gpu": 0.9, "ours_over_mcore_1gpu": 1.25}
