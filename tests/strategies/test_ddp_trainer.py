"""Trainer(strategy="ddp", devices=2, accelerator="cpu") end to end, checked against one process.

``strategy="ddp"`` re-runs the current command for rank 1, so the DDP runs happen in a script:
``scripts/ddp_trainer_runs.py`` plays every scenario once (two ranks, one process group; ``tests/conftest.py``'s
``ddp_trainer_runs``, shared with other tests) and each rank saves what it saw; the tests below check those files against single-device references computed
here, in the test process. Only ``ddp_spawn``, which does not re-run the script, runs from pytest itself.
"""

from __future__ import annotations

import csv
import math
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import tandem
from helpers import clear_launch_variables, max_abs_diff, quiet_trainer
from tandem.utilities.checkpoint import load_checkpoint_file

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def common() -> ModuleType:
    """``scripts/ddp_trainer_common.py``: the module and data both sides train (importable by ddp_spawn's children)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import ddp_trainer_common

        yield ddp_trainer_common
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def runs(ddp_trainer_runs: dict[str, Any]) -> dict[str, Any]:
    """Every scenario's per-rank results, and the job's captured output (the shared launch: ``tests/conftest.py``)."""
    return ddp_trainer_runs


ORDERS = ("sampler", "global")  # the data orders of the elastic scenario (the launch runs both)


def _fit_one_process(common: ModuleType, optimizer: str, k: int) -> tuple[dict, dict]:
    """One process, batch 2b, the same samples and rank 0's initial weights (seed 0)."""
    torch.manual_seed(0)
    model = common.Net(optimizer)
    init = common.weights(model)
    trainer = quiet_trainer(max_epochs=2, accumulate_grad_batches=k)
    trainer.fit(model, DataLoader(common.dataset(common.TRAIN_SAMPLES), batch_size=2 * common.BATCH))
    return init, common.weights(model)


# ---------------------------------------------------------------------------------------------- training


@pytest.mark.timeout(150)
@pytest.mark.parametrize("k", [1, 2], ids=["k1", "k2"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_ranks_equal_one_process_with_twice_the_batch(runs, common, optimizer, k):
    init, final = _fit_one_process(common, optimizer, k)
    for rank, result in enumerate(runs["equivalence"]):
        run = result[f"{optimizer}-k{k}"]
        assert run["steps"] == 48 // k  # 2 epochs of 24 batches per rank: ≥ 20 optimizer steps
        assert max_abs_diff(run["start"], init) == 0.0  # DDP broadcast rank 0's initial weights
        assert max_abs_diff(run["final"], final) <= 1e-6, (rank, max_abs_diff(run["final"], final))


@pytest.mark.timeout(150)
def test_ranks_seeded_differently_start_equal(runs):
    rank0, rank1 = (result["adam-k1"] for result in runs["equivalence"])
    assert max_abs_diff(rank0["init"], rank1["init"]) > 0.01  # seed_everything(0) vs seed_everything(1000)
    assert max_abs_diff(rank0["start"], rank0["init"]) == 0.0
    assert max_abs_diff(rank1["start"], rank0["init"]) == 0.0
    assert max_abs_diff(rank0["final"], rank1["final"]) == 0.0


@pytest.mark.timeout(150)
def test_sampler_interleaves_and_shuffles_one_permutation(runs, common):
    n = common.TRAIN_SAMPLES
    for rank, result in enumerate(runs["equivalence"]):  # global order, shuffle=False: rank r gets r, r+2, ...
        first = [round(v * n) for v in result["sgd-k1"]["samples"][0]]
        assert first == [rank, rank + 2, rank + 4, rank + 6]
    # shuffle=True with ranks seeded differently: still one permutation per epoch, split between the ranks
    per_rank = [[round(v * n) for batch in r["shuffled_samples"] for v in batch] for r in runs["equivalence"]]
    half = n // 2
    epochs = [[p[e * half : (e + 1) * half] for p in per_rank] for e in (0, 1)]
    for ranks in epochs:
        assert sorted(ranks[0] + ranks[1]) == list(range(n))
    assert epochs[0][0] != epochs[1][0]  # set_epoch: a new order each epoch
    # the default order with shuffle=False: Lightning's training sampler, shuffled with rank 0's seed (0 here)
    for rank, result in enumerate(runs["equivalence"]):
        drawn = [round(v * n) for batch in result["unshuffled_default"] for v in batch]
        assert drawn == list(DistributedSampler(range(n), num_replicas=2, rank=rank, shuffle=True, seed=0))


@pytest.mark.timeout(150)
def test_parity_with_hand_written_torch_ddp(runs):
    for result in runs["equivalence"]:  # DistributedDataParallel + DistributedSampler + SGD, written by hand
        assert max_abs_diff(result["hand_written"], result["sgd-k1"]["final"]) == 0.0


@pytest.mark.timeout(150)
def test_unequal_training_batch_counts_are_evened_with_a_warning(runs):
    rank0, rank1 = runs["evaluation"]
    assert rank0["uneven_steps"] == rank1["uneven_steps"] == 10  # 5 and 8 batches: both train 5 per epoch
    assert len(rank0["uneven_warnings"]) == 1 and "[5, 8]" in rank0["uneven_warnings"][0]
    assert rank1["uneven_warnings"] == []  # warnings come from rank 0 only


# ---------------------------------------------------------------------------------------------- evaluation


@pytest.mark.timeout(150)
def test_uneven_validate_and_test_equal_one_process(runs, common):
    model = common.Net()
    model.load_state_dict(runs["evaluation"][0]["weights"])
    loader = DataLoader(common.dataset(common.EVAL_SAMPLES, seed=2), batch_size=common.EVAL_BATCH)
    expected = {"validate": quiet_trainer().validate(model, loader)[0], "test": quiet_trainer().test(model, loader)[0]}
    assert [r["val_batches"] for r in runs["evaluation"]] == [[6], [5]]  # 51 and 50 samples: no padding
    for result in runs["evaluation"]:
        for stage, metrics in expected.items():
            got = result[stage][0]
            assert got.keys() == metrics.keys()
            for name, value in metrics.items():
                assert math.isclose(got[name], value, rel_tol=1e-6, abs_tol=1e-6), (stage, name, got[name], value)
            acc = "val_acc" if stage == "validate" else "test_acc"
            assert got[acc] == metrics[acc]  # torchmetrics syncs its counts: exact
        # batch size 1: 51 and 50 batches, each logging a step-level sync_dist value, and nothing hangs
        for name, value in expected["validate"].items():
            assert math.isclose(result["validate_batch_1"][0][name], value, rel_tol=1e-6, abs_tol=1e-6)


@pytest.mark.timeout(150)
def test_predict_returns_every_sample_in_dataset_order_on_every_rank(runs, common):
    data = common.dataset(common.EVAL_SAMPLES, seed=2)
    model = common.Net()
    model.load_state_dict(runs["evaluation"][0]["weights"])
    expected = quiet_trainer().predict(model, DataLoader(data, batch_size=common.EVAL_BATCH))
    for result in runs["evaluation"]:
        predictions = result["predict"]
        assert [len(p["x0"]) for p in predictions] == [len(p["x0"]) for p in expected]  # 10 × 10, then 1
        assert torch.equal(torch.cat([p["x0"] for p in predictions]), data.tensors[0][:, 0])
        logits = torch.cat([p["logits"] for p in predictions])
        torch.testing.assert_close(logits, torch.cat([p["logits"] for p in expected]), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------- logging


@pytest.mark.timeout(150)
def test_sync_dist_reduces_sums_and_counts_once_per_epoch(runs):
    # rank r logs v = (r + 1) * (i + 1) at batch i with weight r + 1
    n = runs["logging"][0]["batches"]
    values = {r: [(r + 1) * (i + 1) for i in range(n)] for r in (0, 1)}
    weighted = sum(v * (r + 1) for r in (0, 1) for v in values[r])
    expected = {
        "v_mean": weighted / sum((r + 1) * n for r in (0, 1)),
        "v_sum": sum(values[0]) + sum(values[1]),
        "v_max": max(values[1]),
        "v_min": min(values[0]),
        "v_step": (values[0][-1] + values[1][-1]) / 2,
    }
    for rank, result in enumerate(runs["logging"]):
        assert result["metrics"] == pytest.approx(expected, rel=1e-6)
        # read right after self.log, a step value is this rank's own; it is reduced when published
        assert result["step_values"] == [(rank + 1) * (i + 1) for i in range(n)] * 2
        # no collective per step, and no reduction for the values: every rank logged the same names, so they
        # travel packed (Strategy.reduce_if_agreed: sizes independent of the ranks), never in a gathering; per
        # epoch two reductions are left, the agreement on should_stop and the replica check (the smallest and
        # largest checksum of each tensor over the ranks)
        assert result["reductions"] == 2 * 2
        assert result["gatherings"] == 0 and result["packed"] >= 2 * 2, result


@pytest.mark.timeout(150)
def test_sync_dist_pairs_values_by_name_not_by_logging_order(runs):
    # rank 0 logs a then b, rank 1 logs b then a; "lonely" is logged by rank 0 only
    for result in runs["logging"]:
        paired = result["paired"]
        n = paired["batches"]
        assert paired["gatherings"] >= n  # the names differ at every publishing step: the ranks gather them
        assert paired["epoch"] == {"a_sum": 4.0 * n, "b_sum": 400.0 * n, "lonely_epoch": 5.0}
        assert paired["steps"] == [
            {"a_step": 2.0 * (i + 1), "b_step": 200.0 * (i + 1), "lonely_step": 5.0} for i in range(n)
        ]


@pytest.mark.timeout(150)
def test_a_rank_without_evaluation_batches_gets_the_reduced_metrics(runs, common):
    # one validation sample on two ranks: rank 1 runs no batch and logs nothing, yet both ranks agree
    sys.path.insert(0, str(SCRIPTS))
    try:
        from ddp_trainer_runs import LossOnly
    finally:
        sys.path.remove(str(SCRIPTS))
    model = LossOnly()
    model.load_state_dict(runs["logging"][0]["paired"]["one_sample_weights"])
    (expected,) = quiet_trainer().validate(model, DataLoader(common.dataset(1, seed=2), batch_size=1))
    for result in runs["logging"]:
        (metrics,) = result["paired"]["one_sample"]
        assert metrics == pytest.approx(expected, rel=1e-6) and expected["val_count"] == 1.0


@pytest.mark.timeout(150)
def test_a_metric_logged_on_one_rank_only_is_a_clear_error_on_every_rank(runs):
    for result in runs["mismatch"]:
        assert result["error"] is not None, "validate should have raised"
        assert result["error"].startswith("TandemUserCodeError: The torchmetrics Metric 'val_acc'")
        assert "rank(s) [0] but not on rank(s) [1]" in result["error"]
        assert result["error_seconds"] < 30


@pytest.mark.timeout(150)
def test_print_progress_bar_and_loggers_act_on_rank_zero(runs):
    rank0, rank1 = runs["logging"]
    output = runs["output"]
    assert output.count("tandem-print epoch 0") == 1 and output.count("tandem-print epoch 1") == 1
    assert "Epoch 0" in rank0["printed"] and rank1["printed"] == ""
    assert output.count("Epoch 0") == rank0["printed"].count("Epoch 0")  # nothing from rank 1
    assert rank0["log_dir"] == rank1["log_dir"]
    logs = runs["out"] / "logging" / "tandem_logs"
    assert sorted(p.name for p in logs.iterdir()) == ["version_0"]
    # rank 0's alone: one for the fit, one for the validate (each logs the hyperparameters, as Lightning's)
    assert len(list((logs / "version_0").glob("events.out.tfevents.*"))) == 2


@pytest.mark.timeout(150)
def test_prepare_data_once_per_node_and_setup_on_every_rank(runs):
    rank0, rank1 = runs["logging"]
    assert rank0["prepared"] == 2 and rank1["prepared"] == 0  # fit and validate each prepare once, on rank 0
    assert rank0["stages"] == rank1["stages"] == ["fit", "validate"]  # rank 1's setup found rank 0's file


# ---------------------------------------------------------------------------------------------- checkpoints


# What Lightning 2.6.6 (torch 2.13.0 CPU) keeps in the same scenario, two CPU processes (gloo); recorded with
#   cd /tmp && OMP_NUM_THREADS=1 /root/lightning_suite_work/lvenv/bin/python \
#       tests/strategies/scripts/decisions_lightning.py /tmp/decisions_lightning
# (rank 0's files, best_model_path, and the scores as tensors; see that script's docstring).
LIGHTNING_DECISIONS = {
    "score": {"epoch=1-score=4.00.ckpt": 4.0, "epoch=2-score=4.50.ckpt": 4.5},  # best: epoch=1, kth 4.5
    "drift": {"epoch=0-drift=5.00.ckpt": 5.0, "epoch=1-drift=4.00.ckpt": 4.0},  # best: epoch=1, kth 5.0
}


@pytest.mark.timeout(150)
def test_decisions_on_a_per_rank_metric_are_lightnings(runs):
    """A monitor logged without sync_dist differs between ranks: a checkpoint replaces one of the top k only when
    every rank finds its own value better (Lightning's rule). ``drift`` improves on rank 0 and worsens on rank 1,
    so after the first two epochs nothing is saved: Lightning keeps epochs 0 and 1 (rank 0's decision alone would
    keep epochs 2 and 3)."""
    rank0, rank1 = runs["decisions"]
    assert rank0["epochs"] == rank1["epochs"] == 4 and rank0["stopped_epoch"] == rank1["stopped_epoch"] == 3
    for result, name in ((rank0, "score"), (rank0["drift"], "drift")):
        kept = {os.path.basename(p): score for p, score in result["best_k_models"].items()}
        assert kept == LIGHTNING_DECISIONS[name], name
        assert all(type(score) is torch.Tensor and score.dim() == 0 for score in kept.values())
        assert os.path.basename(result["best_model_path"]) == f"epoch=1-{name}=4.00.ckpt"
        assert type(result["best_model_score"]) is torch.Tensor and result["best_model_score"] == 4.0
        assert result["kth_value"] == max(LIGHTNING_DECISIONS[name].values())
    files = sorted(p.name for p in (runs["out"] / "decisions").iterdir() if p.is_file())
    assert files == sorted(LIGHTNING_DECISIONS["score"])
    assert sorted(p.name for p in (runs["out"] / "decisions" / "drift").iterdir()) == sorted(
        LIGHTNING_DECISIONS["drift"]
    )
    # every rank names the same files (rank 0's names); each ranks them by its own values, as in Lightning
    assert rank1["best_k_models"].keys() == rank0["best_k_models"].keys()
    assert rank1["drift"]["best_k_models"].keys() == rank0["drift"]["best_k_models"].keys()
    # should_stop set on rank 1 alone: both ranks finish that epoch and stop together, nobody hangs
    assert rank0["one_rank_stop_epochs"] == rank1["one_rank_stop_epochs"] == 2
    assert rank0["one_rank_stop_steps"] == rank1["one_rank_stop_steps"]


@pytest.mark.timeout(150)
def test_resume_is_exact_and_identical_on_every_rank(runs):
    rank0, rank1 = runs["resume"]
    for result in (rank0, rank1):  # 2 epochs + resume from last.ckpt to 4 == 4 epochs, bit for bit
        assert max_abs_diff(result["resumed"], result["whole"]) == 0.0
        assert max_abs_diff(result["restored"], result["first_half"]) == 0.0
    assert max_abs_diff(rank0["restored"], rank1["restored"]) == 0.0
    optimizers = [r["restored_optimizer"]["state"] for r in (rank0, rank1)]
    assert optimizers[0].keys() == optimizers[1].keys() and optimizers[0]
    for index, state in optimizers[0].items():
        for key, value in state.items():
            assert torch.equal(value, optimizers[1][index][key])


def _csv_rows(folder: Path) -> list[tuple[int, int]]:
    """(step, epoch) of every row of every version's metrics.csv under ``folder``, in the order written."""
    rows = []
    for version in sorted(folder.glob("version_*"), key=lambda p: int(p.name.split("_")[1])):
        for row in csv.DictReader((version / "metrics.csv").open()):
            rows.append((int(row["step"]), int(float(row["epoch"]))))
    return rows


@pytest.mark.timeout(150)
def test_the_global_order_trains_alike_on_one_and_two_processes_and_the_default_order_as_lightning(runs):
    """Shuffled, 2 epochs, Adam, one process x batch 8 against 2 ranks x batch 4: data_order="global" ends with the
    same weights (within 1e-6: the sums are added in another order); the default, Lightning's order, draws a
    RandomSampler's order on one process and the DistributedSampler's on two, so the runs differ as Lightning's do."""
    one, two = runs["elastic_one_process"], runs["elastic"][0]
    assert max_abs_diff(two["global"]["whole"], one["global"]) <= 1e-6, max_abs_diff(
        two["global"]["whole"], one["global"]
    )
    assert max_abs_diff(two["sampler"]["whole"], one["sampler"]) > 1e-3


@pytest.mark.timeout(150)
@pytest.mark.parametrize("order", ORDERS)
def test_two_ranks_resume_on_one_process_with_twice_the_batch_as_if_never_interrupted(runs, common, order):
    """Elastic resume 2 -> 1, in either data order: a checkpoint saved mid-epoch by 2 ranks x batch 4 (shuffled),
    resumed on one process x batch 8, ends with the weights of the uninterrupted 2-rank run; the step, epoch and CSV
    rows continue."""
    whole = runs["elastic"][0][order]["whole"]
    assert max_abs_diff(whole, runs["elastic"][1][order]["whole"]) == 0.0
    tandem.seed_everything(99)  # the checkpoint decides the order, not this process's seed
    model = common.Net("adam", lr=0.01)
    csv_folder = runs["out"] / f"elastic-csv-two-{order}"
    trainer = common.elastic_trainer(csv=csv_folder, data_order=order)
    loader = DataLoader(common.dataset(common.TRAIN_SAMPLES), batch_size=2 * common.BATCH, shuffle=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, loader, ckpt_path=runs["out"] / f"elastic-two-{order}.ckpt")
    assert not [w for w in caught if "global batch" in str(w.message)]  # kept: nothing to warn about
    assert trainer.global_step == 48 and trainer.current_epoch == 2
    assert max_abs_diff(common.weights(model), whole) <= 1e-6, max_abs_diff(common.weights(model), whole)
    uninterrupted, resumed = _csv_rows(csv_folder)[:48], _csv_rows(csv_folder)[48:]
    assert uninterrupted == [(step, step // 24) for step in range(48)]
    assert resumed == uninterrupted[common.ELASTIC_STEP :]  # no gap, no repeat


@pytest.mark.timeout(150)
@pytest.mark.parametrize("order", ORDERS)
def test_one_process_resumes_on_two_ranks_with_half_the_batch_as_if_never_interrupted(runs, common, order):
    """Elastic resume 1 -> 2, in either data order (the default's one process draws a RandomSampler's epoch seeds
    from the global generator: the checkpoint records the epoch's seed, and rank 0 draws the next epochs' seeds):
    one process x batch 8 saved mid-epoch, 2 ranks x batch 4 continue; both ranks end with the uninterrupted
    one-process run's weights; the one-process run's CSV continues on rank 0."""
    expected = runs["elastic_one_process"][order]
    for result in runs["elastic"]:
        assert result[order]["global_step"] == 48
        difference = max_abs_diff(result[order]["from_one"], expected)
        assert difference <= 1e-6, difference
    rows = _csv_rows(runs["out"] / f"elastic-csv-one-{order}")
    assert rows[:48] == [(step, step // 24) for step in range(48)]
    assert rows[48:] == rows[common.ELASTIC_STEP : 48]  # no gap, no repeat


@pytest.mark.timeout(150)
def test_one_checkpoint_file_per_save_written_by_rank_zero(runs):
    rank0, rank1 = runs["resume"]
    per_epoch = [f"epoch={e}-step={24 * (e + 1)}.ckpt" for e in range(4)]
    whole = [name for e in per_epoch for name in (e, "last.ckpt")]
    assert rank0["writes_first_half"] == whole + whole[:4] and rank1["writes_first_half"] == []
    folder = runs["out"] / "halves" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == sorted([*per_epoch, "last.ckpt"])  # no temporary files
    last = load_checkpoint_file(folder / "last.ckpt")
    assert last["epoch"] == 3 and last["global_step"] == 96
    assert max_abs_diff(last["state_dict"], rank0["resumed"]) == 0.0


# ---------------------------------------------------------------------------------------------- prediction writer


@pytest.mark.timeout(150)
def test_prediction_writer_files_of_the_ranks_cover_every_sample_once(runs, common):
    n = common.EVAL_SAMPLES
    indices = []
    for rank in (0, 1):
        written = torch.load(runs["out"] / "predictions" / f"predictions-rank{rank}.pt", weights_only=False)
        (per_batch,) = written["batch_indices"]  # one predict dataloader
        assert per_batch == runs["prediction_writer"][rank]["batch_writes"]  # the batch writes saw the same
        assert len(per_batch) == [6, 5][rank]  # rank 0: 51 samples in 6 batches, rank 1: 50 in 5
        for batch, prediction in zip(per_batch, written["predictions"]):
            assert [round(v * n) for v in prediction["x0"].tolist()] == batch  # each prediction is its sample's
        indices += [i for batch in per_batch for i in batch]
    assert sorted(indices) == list(range(n))  # every sample exactly once, over the two files
    returned = runs["prediction_writer"][0]["returned"]
    assert torch.equal(torch.cat([p["x0"] for p in returned]), common.dataset(n, seed=2).tensors[0][:, 0])


# ---------------------------------------------------------------------------------------------- uneven data


def _uneven_reference(common: ModuleType, k: int) -> dict[str, torch.Tensor]:
    """One process, batch 2b: step i trains rank 0's batch i with rank 1's, for the 5 batches both ranks have."""
    x, y = common.dataset(8 * common.BATCH + 5 * common.BATCH, seed=4).tensors
    b = common.BATCH
    order = [j for i in range(5) for j in [*range(i * b, (i + 1) * b), *range((8 + i) * b, (9 + i) * b)]]
    torch.manual_seed(0)
    model = common.Net()
    quiet_trainer(max_epochs=2, accumulate_grad_batches=k).fit(
        model, DataLoader(torch.utils.data.TensorDataset(x[order], y[order]), batch_size=2 * b)
    )
    return common.weights(model)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("k", [1, 3], ids=["k1", "k3"])
def test_uneven_data_of_unknown_length_ends_each_epoch_on_every_rank_together(runs, common, k):
    # rank 0 has 8 batches an epoch, rank 1 has 5; with k=3 rank 1 runs out in the second accumulation window
    rank0, rank1 = (result[f"k{k}"] for result in runs["uneven"])
    assert rank0["steps"] == rank1["steps"] == 2 * math.ceil(5 / k)  # the short window steps at the epoch's end
    assert rank0["grads_left"] == rank1["grads_left"] == []  # nothing accumulated is carried on
    # val_check_interval (batches) on every rank at the same steps, at its multiples only (Lightning's rule: k=3 with
    # interval 2 validates after batches 2 and 4, not at the 5-batch epoch's end); once at the epoch's last batch
    assert rank0["validated_at"] == rank1["validated_at"] == ([5, 10] if k == 1 else [0, 1, 2, 3])
    assert max_abs_diff(rank0["final"], rank1["final"]) == 0.0
    assert max_abs_diff(rank0["final"], _uneven_reference(common, k)) <= 1e-6
    n = 8 * common.BATCH + 5 * common.BATCH
    for rank, result in enumerate((rank0, rank1)):  # each epoch: the rank's own first 5 batches, in order
        first = 0 if rank == 0 else 8 * common.BATCH
        seen = [round(v * n) for batch in result["samples"] for v in batch]
        assert seen == list(range(first, first + 5 * common.BATCH)) * 2
    (warning,) = rank0["warnings"]  # once (two uneven epochs), from rank 0
    assert "in epoch 0, rank(s) [1] had 5 batches and rank(s) [0] had more" in warning
    assert "same number of batches" in warning and "__len__" in warning
    assert rank1["warnings"] == []
    # limit_train_batches=4 ends the epoch before anyone runs out: no batch read past it, no warning
    for result in runs["uneven"]:
        assert result["limited"] == {"steps": 4, "warnings": []}


@pytest.mark.timeout(150)
def test_uneven_evaluation_of_unknown_length_reduces_over_every_sample(runs, common):
    # rank 0 evaluates 4 batches, rank 1 one; Net logs a step-level sync_dist value too: nothing may hang
    model, fitted_model = common.Net(), common.Net()
    model.load_state_dict(runs["uneven"][0]["k3"]["final"])  # the script's validate / test / predict use it
    fitted_model.load_state_dict(runs["uneven"][0]["k1"]["final"])  # the k=1 fit validated at its last batch
    data = common.dataset(5 * common.EVAL_BATCH, seed=5)
    loader = DataLoader(data, batch_size=common.EVAL_BATCH)
    expected = {"validate": quiet_trainer().validate(model, loader)[0], "test": quiet_trainer().test(model, loader)[0]}
    expected_at_the_end = quiet_trainer().validate(fitted_model, loader)[0]
    for rank, result in enumerate(runs["uneven"]):
        for stage, metrics in expected.items():
            (got,) = result[stage]
            assert got == pytest.approx(metrics, rel=1e-6, abs=1e-6), (stage, got, metrics)
        fitted = {name: result["k1"]["val"][name] for name in expected_at_the_end}  # validation at the fit's end
        assert fitted == pytest.approx(expected_at_the_end, rel=1e-6, abs=1e-6)
        # data tandem did not shard: each rank predicts its own batches
        own = range(0, 40) if rank == 0 else range(40, 50)
        assert torch.equal(torch.cat([p["x0"] for p in result["predict"]]), data.tensors[0][list(own), 0])


# ---------------------------------------------------------------------------------------------- ddp_spawn


@pytest.mark.timeout(150)
def test_ddp_spawn_from_this_process_returns_the_ddp_result(runs, common, monkeypatch):
    clear_launch_variables(monkeypatch)  # and restored after: the launcher exports MASTER_PORT
    torch.manual_seed(0)
    model = common.Net("sgd")
    trainer = tandem.Trainer(
        strategy="ddp_spawn",
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        data_order="global",  # as the equivalence runs
    )
    trainer.fit(model, DataLoader(common.dataset(common.TRAIN_SAMPLES), batch_size=common.BATCH))
    assert max_abs_diff(common.weights(model), runs["equivalence"][0]["sgd-k1"]["final"]) == 0.0
    assert set(trainer.callback_metrics) == {"train_loss"} and torch.isfinite(trainer.callback_metrics["train_loss"])


@pytest.mark.timeout(150)
def test_bf16_true_trains_in_bfloat16_on_every_rank(runs):
    rank0, rank1 = runs["true_half"]
    for result in (rank0, rank1):
        assert result["built"] == {torch.bfloat16}  # trainer.init_module() built in bfloat16
        assert {v.dtype for v in result["final"].values() if v.is_floating_point()} == {torch.bfloat16}
        assert result["inputs"] == {(torch.bfloat16, torch.int64)}  # features cast, targets kept
        assert result["losses"][-1] < result["losses"][0] - 0.2, result["losses"]
        assert result["default_dtype"] == torch.float32
    assert max_abs_diff(rank0["final"], rank1["final"]) == 0.0  # bfloat16 gradients all-reduced: one model
