"""The peers benchmark's pure parts: config names, the cluster file it writes, the ratios it reports."""

from __future__ import annotations

import pytest

from benchmarks.executor.peers import cluster_yaml, ours_paths, parse_config, ratios
from planner.cluster import parse_cluster
from planner.documents import load_yaml_text


def test_config_names() -> None:
    assert parse_config("ours-1") == ("ours", 1, 1, 1, 0)
    assert parse_config("mcore-4-tp2-pp1-mb2") == ("mcore", 4, 2, 1, 2)
    assert parse_config("titan-4-tp2") == ("titan", 4, 2, 1, 0)
    for bad in ("ours", "deepspeed-4", "titan-4-pp2-tp2", "ours-4-mb", "ours-1-fast", "ours-1-base-mb2"):
        with pytest.raises(ValueError, match="expected ours"):
            parse_config(bad)


def test_ours_path_suffixes() -> None:
    assert parse_config("ours-4-mb2-base") == ("ours", 4, 1, 1, 2)
    assert [ours_paths(n) for n in ("ours-1", "ours-1-base", "ours-1-noce", "ours-4-mb2-nocast")] == [
        (True, True), (False, False), (False, True), (True, False)]
    with pytest.raises(ValueError, match="ours-... config"):
        parse_config("titan-1-base")


def test_ratios_compare_ours_with_its_base_twin() -> None:
    rows = [{"config": "ours-1", "system": "ours", "gpus": 1, "tokens_per_s": 105.0},
            {"config": "ours-1-base", "system": "ours", "gpus": 1, "tokens_per_s": 100.0},
            {"config": "titan-1", "system": "titan", "gpus": 1, "tokens_per_s": 95.0}]
    assert ratios(rows) == {"ours-1_over_ours-1-base": 1.05, "ours_over_titan_1gpu": 1.105}


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
