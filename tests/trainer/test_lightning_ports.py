"""Issue 7's "done when": three programs written in Lightning's style (``scripts/lightning_programs.py``),
ported by renaming imports only, run on one device and under ``ddp`` (the shared launch of
``conftest.py``), with the results Lightning gives them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from helpers import max_abs_diff, quiet_trainer

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("scripts_on_path")]
QUIET = dict(accelerator="cpu", logger=False, enable_model_summary=False)


def _close(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-6) for k in a)


def test_gan_with_manual_optimization(tmp_path, core_ddp):
    import lightning_programs as programs

    model, trainer = programs.run_gan(tmp_path, **QUIET)
    assert trainer.global_step == 2 * 4 * 2  # 2 epochs of 4 batches, generator and discriminator steps
    assert {"g_loss", "d_loss", "sample_mean"} <= set(trainer.callback_metrics)
    assert all(math.isfinite(float(v)) for v in trainer.callback_metrics.values())
    untrained = programs.GAN()
    assert max_abs_diff(model.generator.state_dict(), untrained.generator.state_dict()) > 1e-4
    rank0, rank1 = (result["gan"] for result in core_ddp["ports"])
    assert rank0["steps"] == rank1["steps"] == 2 * 2 * 2  # each rank: 2 of the 4 batches per epoch
    assert max_abs_diff(rank0["final"], rank1["final"]) == 0.0  # both networks stayed in sync
    assert {"g_loss", "d_loss", "sample_mean"} <= set(rank0["metrics"])


def test_gan_with_find_unused_parameters_false_names_the_parameters_and_the_fix(core_ddp):
    for result in core_ddp["unused"]:
        assert result["error"] is not None and "received no gradient" in result["error"]
        assert "discriminator." in result["error"] and "torch did not say which" not in result["error"]
        assert "toggle_optimizer" in result["error"] and "strategy='ddp_find_unused_parameters_true'" in result["error"]


def test_several_validation_sets(tmp_path, core_ddp):
    import lightning_programs as programs

    model, trainer, results = programs.run_two_val_sets(tmp_path, **QUIET)
    assert [sorted(r) for r in results] == [
        ["val_acc/dataloader_idx_0", "val_loss/dataloader_idx_0"],
        ["val_acc/dataloader_idx_1", "val_loss/dataloader_idx_1"],
    ]
    assert trainer.num_val_batches == [5, 3]
    assert Path(trainer.checkpoint_callback.best_model_path).is_file()
    assert trainer.lr_scheduler_configs[0].monitor == "val_loss/dataloader_idx_0"
    # under DDP: the same metrics, from the DDP-trained weights, as one process computes them
    rank0, rank1 = (result["two"] for result in core_ddp["ports"])
    assert max_abs_diff(rank0["final"], rank1["final"]) == 0.0
    ddp_model = programs.TwoValSets()
    ddp_model.load_state_dict(rank0["final"])
    expected = quiet_trainer().validate(ddp_model, programs.val_sets(), verbose=False)
    for result in (rank0, rank1):
        assert all(_close(got, want) for got, want in zip(result["validate"], expected)), (result["validate"], expected)
    assert rank0["best"] == rank1["best"] and Path(rank0["best"]).is_file()


def test_module_with_its_own_data_restored_with_load_from_checkpoint(tmp_path, core_ddp):
    import lightning_programs as programs

    run = programs.run_own_data(tmp_path, **QUIET)
    assert run["model"].prepared == 1 and (tmp_path / "points.pt").is_file()
    assert run["trainer"].num_training_batches == 10 and run["trainer"].num_val_batches == [3]
    restored = run["restored"]
    assert isinstance(restored, programs.OwnData) and restored.hparams == run["model"].hparams
    best = torch.load(run["best"])  # plain torch.load (weights_only=True) reads a tandem checkpoint
    assert max_abs_diff(restored.state_dict(), best["state_dict"]) == 0.0
    assert run["test_restored"] == run["test_best"] and set(run["test_best"][0]) == {"test_loss", "test_acc"}
    # under DDP: prepare_data ran once (local rank 0), the best checkpoint restored on every rank gives
    # the test metrics one process computes from it
    rank0, rank1 = (result["own"] for result in core_ddp["ports"])
    assert (rank0["prepared"], rank1["prepared"]) == (1, 0)
    assert rank0["best"] == rank1["best"] and max_abs_diff(rank0["restored"], rank1["restored"]) == 0.0
    ddp_best = programs.OwnData.load_from_checkpoint(rank0["best"])
    expected = quiet_trainer().test(ddp_best, verbose=False)
    for result in (rank0, rank1):
        assert _close(result["test_restored"][0], expected[0]) and result["test_restored"] == result["test_best"]
