"""Layout independence: save under plan X, load under a different plan Y, continue — the losses
and final weights equal uninterrupted (dense reference) training."""

from __future__ import annotations

from dataclasses import replace

import pytest
from exec_jobs import ORACLE_OPTIM, TINY, TINY8, checkpoint_job, global_batches, make_plan
from torch.testing import assert_close

from executor.state.checkpoint import read_meta
from planner.errors import SpecError
from tests.support.reference import reference_train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]


def test_save_under_x_load_under_y_continues_exactly(dist_pool, tmp_path) -> None:
    steps, split = 4, 2
    x = make_plan(TINY, [(5, 2, "1f1b", [(2, 1), (1, 3)]), (3, 3, "gpipe", [(1, 4)])])
    y = make_plan(TINY, [(2, 1, "gpipe", [(1, 2), (2, 2)]), (6, 4, "1f1b", [(2, 4)])])
    other = make_plan(TINY8, [(8, 1, "1f1b", [(1, 8)])])
    batches = global_batches(TINY, 8, steps, seed=5)
    ref = reference_train(TINY, batches, optim=ORACLE_OPTIM)
    ck = tmp_path / "ckpt"
    res = dist_pool.run(checkpoint_job, x, y, other, batches, split, str(ck))
    for rank in range(y.world_size):
        r = res[rank]
        assert r["extra"] == {"data_position": split, "note": "x"}
        assert r["step_after_load"] == split
        assert_close(r["losses_y"], ref.losses[split:], rtol=1e-5, atol=0)
    for rank in range(x.world_size):
        assert_close(res[rank]["losses_x"], ref.losses[:split], rtol=1e-5, atol=0)
    for name, want in ref.state.items():
        assert_close(res[0]["state"][name], want, rtol=1e-5, atol=2e-6, msg=lambda m, n=name: f"{n}: {m}")
    meta = read_meta(ck)
    assert meta == res[0]["meta"]
    assert meta["step"] == split and meta["model"] == TINY.to_dict() and meta["format"] == "hexiscale.ckpt/2"
    assert "differs in" in res[0]["other_model_error"] and "num_layers" in res[0]["other_model_error"]


def test_read_meta_errors(tmp_path) -> None:
    with pytest.raises(SpecError, match="no meta.json"):
        read_meta(tmp_path)
    (tmp_path / "meta.json").write_text('{"format": "something-else"}')
    with pytest.raises(SpecError, match="not a hexiscale.ckpt/2"):
        read_meta(tmp_path)
    (tmp_path / "meta.json").write_text("{broken")
    with pytest.raises(SpecError, match="cannot read"):
        read_meta(tmp_path)



def test_damaged_checkpoints_fail_with_one_line_on_every_rank(dist_pool, tmp_path) -> None:
    """Saved under a 2-pipeline plan, loaded under another layout: each damage is named, with the
    same single line on every rank of the loading plan."""
    from damage_jobs import damaged_checkpoints_job

    x = make_plan(TINY, [(2, 1, "1f1b", [(2, 2), (1, 2)]), (2, 1, "1f1b", [(1, 4)])])
    y = make_plan(TINY, [(4, 2, "1f1b", [(1, 1), (2, 3)])])
    wide = replace(TINY, hidden_size=TINY.hidden_size * 2)
    other = make_plan(wide, [(4, 2, "1f1b", [(1, 4)])])
    res = dist_pool.run(damaged_checkpoints_job, x, y, other, str(tmp_path))
    expect = {"good": "loaded", "truncated": "is truncated", "missing": "is missing",
              "flipped": "does not match its checksum", "shape": "has shape", "model": "differs in num_layers",
              "nan": "holds NaN or infinite values"}
    for kind, words in expect.items():
        n = other.world_size if kind == "shape" else y.world_size
        seen = {res[r][kind] for r in range(n)}
        assert len(seen) == 1, (kind, seen)
        line = seen.pop()
        assert words in line and "\n" not in line, (kind, line)
        assert kind == "good" or line.startswith(f"checkpoint: {tmp_path / kind}"), line
    refused = {res[r]["refused"] for r in range(x.world_size)}
    assert len(refused) == 1 and "refusing to save" in refused.pop()
    assert not (tmp_path / "refused").exists()
