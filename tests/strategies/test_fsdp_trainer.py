"""Trainer(strategy="fsdp", devices=2, accelerator="cpu") end to end, checked against DDP and one process.

``scripts/fsdp_runs.py`` plays every scenario once in one launch (two ranks, one process group) and each rank
saves what it saw; the tests below check those files against single-device references computed here. The
launch ends with a rank failing on purpose, so it also shows the crash handling. What needs one process
(resuming a 2-rank sharded checkpoint on 1 rank, loading FSDP files on one device) and ``start_method="spawn"``
run here, in the test process.
"""

from __future__ import annotations

import math
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

import tandem
from helpers import (
    Payload,
    TinyModule,
    clear_launch_variables,
    killed_mid_save,
    launch_free_env,
    loader,
    max_abs_diff,
    quiet_trainer,
)
from tandem.callbacks import ModelCheckpoint
from tandem.strategies import FSDPStrategy
from tandem.strategies.environments.machine import find_free_port
from tandem.utilities.checkpoint import load_checkpoint_file
from tandem.utilities.exceptions import CheckpointError, TandemWarning

SCRIPTS = Path(__file__).parent / "scripts"
SCENARIOS = (
    "equivalence",
    "evaluation",
    "init",
    "resume_full",
    "resume_sharded",
    "elastic",
    "export",
    "true_half",
    "compiled",
    "crash",
)  # crash ends the job
pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def scripts() -> tuple[ModuleType, ModuleType]:
    """``scripts/ddp_trainer_common.py`` (the module and data shared with the DDP tests) and
    ``scripts/fsdp_runs.py``, importable here and by spawned children."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import ddp_trainer_common
        import fsdp_runs

        yield ddp_trainer_common, fsdp_runs
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every scenario's per-rank results, and the job's captured output."""
    out = tmp_path_factory.mktemp("fsdp_trainer")
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "fsdp_runs.py"), *SCENARIOS, "--out", str(out), "--hang-after", "100"],
        capture_output=True,
        text=True,
        timeout=130,
        env={**launch_free_env(), "PYTHONUNBUFFERED": "1"},
        cwd=out,
    )
    results: dict[str, Any] = {"out": out, "output": done.stdout + done.stderr, "returncode": done.returncode}
    for name in SCENARIOS[:-1]:
        files = [out / f"{name}-rank{r}.pt" for r in (0, 1)]
        assert all(f.exists() for f in files), f"{name} did not finish:\n" + results["output"][-6000:]
        results[name] = [torch.load(f, weights_only=False) for f in files]
    return results


def _one_process(common: ModuleType, model: tandem.TrainingModule, batch: int, **kwargs: Any) -> dict[str, Any]:
    quiet_trainer(**kwargs).fit(model, DataLoader(common.dataset(common.TRAIN_SAMPLES), batch_size=batch))
    return common.weights(model)


def _val_loader(common: ModuleType) -> DataLoader:
    return DataLoader(common.dataset(common.EVAL_SAMPLES, seed=2), batch_size=common.EVAL_BATCH)


def _close(got: dict[str, float], expected: dict[str, float]) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert math.isclose(got[name], value, rel_tol=1e-6, abs_tol=1e-6), (name, got[name], value)


# ---------------------------------------------------------------------------------------------- training


def test_fsdp_equals_ddp_equals_one_process_with_twice_the_batch(runs, scripts):
    common, fsdp_runs = scripts
    torch.manual_seed(0)
    model = fsdp_runs.Scheduled("adam")
    init = common.weights(model)
    trainer = quiet_trainer(**fsdp_runs.FIT)
    trainer.fit(
        model, DataLoader(common.dataset(common.TRAIN_SAMPLES), batch_size=2 * common.BATCH), _val_loader(common)
    )
    reference, lr = common.weights(model), trainer.optimizers[0].param_groups[0]["lr"]
    rank0, rank1 = runs["equivalence"]
    for name in ("ddp", "fsdp", "fsdp-ac-offload"):
        run = rank0[name]
        assert run["steps"] == 24  # 2 epochs of 24 batches per rank, accumulating 2: ≥ 20 optimizer steps
        assert max_abs_diff(run["start"], init) == 0.0  # rank 0's weights, though rank 1 was seeded differently
        assert max_abs_diff(run["final"], reference) <= 1e-6, (name, max_abs_diff(run["final"], reference))
        assert run["lr"] == pytest.approx(lr, rel=1e-12)  # the epoch and the step scheduler stepped alike
        assert run["val_loss"] == pytest.approx(float(trainer.callback_metrics["val_loss"]), rel=1e-5)
    assert max_abs_diff(rank0["fsdp"]["final"], rank0["ddp"]["final"]) <= 1e-6
    assert rank0["fsdp"]["groups"] == 2  # the policy made each Linear a group (the root is the third)
    assert rank1["fsdp"]["final"] == {}  # the gathered weights arrive on rank 0 only


def test_meta_initialisation_and_configure_model(runs, scripts):
    common, fsdp_runs = scripts
    rank0, rank1 = runs["init"]
    assert rank0["meta"] == [True] * 4 and rank0["metric_device"] == "cpu"  # parameters only went to meta
    for name, value in rank0["start"].items():  # reset_parameters() ran on each shard: Linear's bounds
        fan_in = 8 if name.startswith("net.0") else 16
        assert 0 < value.abs().max() <= 1 / math.sqrt(fan_in) and torch.isfinite(value).all()
    model = common.Net("sgd")  # one process from the same start: the same final weights
    model.load_state_dict(rank0["start"])
    assert max_abs_diff(rank0["final"], _one_process(common, model, 2 * common.BATCH, max_epochs=1)) <= 1e-6
    model.load_state_dict(rank0["final"])
    (expected,) = quiet_trainer().validate(model, _val_loader(common))
    for result in (rank0, rank1):  # torchmetrics states survived the materialisation
        _close(result["validate"][0], expected)

    configured = rank0["configured"]
    assert configured["groups"] == 2  # the two Linear layers sharded in configure_model
    model = fsdp_runs.Configured()
    model.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    model.load_state_dict(configured["start"])
    assert max_abs_diff(configured["final"], _one_process(common, model, 2 * common.BATCH, max_epochs=1)) <= 1e-6
    (expected,) = quiet_trainer().validate(model, _val_loader(common))
    for result in (rank0, rank1):
        _close(result["configured"]["validate"][0], expected)


def test_a_dropped_fsdp_run_frees_its_trainer_and_optimizer_without_the_garbage_collector(runs):
    # tandem's objects hold no reference cycle: with the collector off, the Trainer and the optimizer (with its
    # state) go as soon as the script drops them. The sharded module itself goes at the next collection: torch's
    # fully_shard keeps every sharded module in cycles with its FSDP state and hooks (plain torch does too).
    for result in runs["init"]:
        memory = result["memory"]
        assert not memory["trainer"] and not memory["optimizer"] and not memory["module_after_collect"], memory


# ---------------------------------------------------------------------------------------------- evaluation


def test_uneven_evaluation_equals_one_process_and_does_not_hang(runs, scripts):
    common, fsdp_runs = scripts
    model = common.Net()
    model.load_state_dict(runs["evaluation"][0]["weights"])
    expected = {
        "validate": quiet_trainer().validate(model, _val_loader(common))[0],
        "test": quiet_trainer().test(model, _val_loader(common))[0],
    }
    predictions = quiet_trainer().predict(model, _val_loader(common))
    data = common.dataset(common.EVAL_SAMPLES, seed=2)
    for result in runs["evaluation"]:
        assert result["val_batches"] in ([6], [5])  # 51 and 50 samples: rank 0 runs one FSDP forward more
        assert result["steps_after_evaluation"] == 4  # the sharded module trains again under a new Trainer
        for stage in ("validate", "test"):
            _close(result[stage][0], expected[stage])
        assert [len(p["x0"]) for p in result["predict"]] == [len(p["x0"]) for p in predictions]
        assert torch.equal(torch.cat([p["x0"] for p in result["predict"]]), data.tensors[0][:, 0])
        got, want = (torch.cat([p["logits"] for p in ps]) for ps in (result["predict"], predictions))
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_a_rank_without_evaluation_batches_joins_the_gathers(runs, scripts):
    from ddp_trainer_runs import LossOnly

    model = LossOnly()
    model.load_state_dict(runs["evaluation"][0]["one_sample_weights"])
    (expected,) = quiet_trainer().validate(model, DataLoader(scripts[0].dataset(1, seed=2), batch_size=1))
    for result in runs["evaluation"]:
        _close(result["one_sample"][0], expected)


# ---------------------------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_resume_is_exact(runs, kind):
    rank0, rank1 = runs[f"resume_{kind}"]
    assert max_abs_diff(rank0["resumed"], rank0["whole"]) == 0.0  # 2 epochs + resume to 4 == 4 epochs, bitwise
    assert max_abs_diff(rank0["restored"], rank0["first_half"]) == 0.0
    assert rank0["restored_step"] == 24 and rank1["restored_step"] == 24
    _equal_optimizer_states(rank0["restored_optimizer"], rank0["first_half_optimizer"])
    assert rank0["last_model_path"] == rank1["last_model_path"]


def test_full_checkpoints_are_one_file_in_tandems_format(runs):
    folder = runs["out"] / "full-halves" / "checkpoints"
    names = [f"epoch={e}-step={12 * (e + 1)}.ckpt" for e in range(4)] + ["last.ckpt"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)  # files only, no temporary left
    last = load_checkpoint_file(folder / "last.ckpt")
    assert last["global_step"] == 48 and max_abs_diff(last["state_dict"], runs["resume_full"][0]["resumed"]) == 0.0
    assert sorted(last["optimizer_states"][0]["state"]) == [0, 1, 2, 3]  # numbered, as torch's optimizers do
    rank0 = runs["resume_full"][0]
    assert max_abs_diff(rank0["by_ddp"], rank0["by_fsdp"]) <= 1e-6  # DDP resumed from FSDP's file


def test_sharded_checkpoints_are_directories_written_by_every_rank(runs):
    folder = runs["out"] / "sharded-halves" / "checkpoints"
    names = [f"epoch={e}-step={12 * (e + 1)}.ckpt" for e in range(4)] + ["last.ckpt"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)  # no temporary or old directory left
    for name in names:
        files = sorted(p.name for p in (folder / name).iterdir())
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"], (name, files)


def test_after_fit_the_whole_weights_leave_the_sharded_module_by_one_documented_way(runs, scripts):
    """save_checkpoint(path, weights_only=True) under state_dict_type="sharded" writes one file of plain tensors
    that a plain module loads; rank 0 alone calling the sharded module or its state_dict() (the ddp idiom) is an
    error naming that and full_module_state_dict() instead of DTensor errors, a hang or shards."""
    common, fsdp_runs = scripts
    rank0, rank1 = runs["export"]
    saved = torch.load(rank0["path"])  # weights_only=True: torch's default
    assert not any(isinstance(v, torch.distributed.tensor.DTensor) for v in saved["state_dict"].values())
    plain = common.Net("sgd")
    plain.load_state_dict(saved["state_dict"])
    assert max_abs_diff(common.weights(plain), rank0["full"]) == 0.0
    torch.manual_seed(0)
    reference = common.Net("sgd")
    data = common.dataset(fsdp_runs.EXPORT_SAMPLES)
    quiet_trainer(max_epochs=1).fit(reference, DataLoader(data, batch_size=2 * common.BATCH))
    assert max_abs_diff(common.weights(plain), common.weights(reference)) <= 1e-6
    assert set(rank0["errors"]) == {"state_dict", "forward", "layer"}
    for what, message in rank0["errors"].items():
        assert message is not None and "Net is still sharded by FSDP" in message, what
        assert "save_checkpoint('model.ckpt', weights_only=True)" in message
        assert "trainer.strategy.full_module_state_dict()" in message
    assert "calling Net.net.3(...)" in rank0["errors"]["layer"] and "Net.state_dict()" in rank0["errors"]["state_dict"]
    evaluation = DataLoader(common.dataset(fsdp_runs.EXPORT_SAMPLES, seed=2), batch_size=common.EVAL_BATCH)
    (expected_validation,) = quiet_trainer().validate(plain, evaluation)
    for result in (rank0, rank1):
        _close(result["validate"][0], expected_validation)


def test_a_sharded_checkpoint_needs_fsdp(runs, scripts):
    path = runs["out"] / "sharded-halves" / "checkpoints" / "epoch=1-step=24.ckpt"
    trainer = quiet_trainer(max_epochs=3)
    with pytest.raises(CheckpointError, match="strategy='single_device' cannot load. Load it with strategy='fsdp'"):
        common = scripts[0]
        trainer.fit(common.Net("adam"), DataLoader(common.dataset(8), batch_size=4), ckpt_path=path)


def test_checkpoints_written_by_two_ranks_resume_in_one_process(runs, scripts, monkeypatch):
    """The sharded directory on one FSDP rank (resharded by torch.distributed.checkpoint), the full file on one
    device: both restore the 2-rank run's weights and Adam state exactly, and training continues."""
    (common, fsdp_runs), rank0 = scripts, runs["resume_sharded"][0]
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    loader = DataLoader(common.dataset(fsdp_runs.RESUME_SAMPLES), batch_size=2 * common.BATCH, shuffle=True)
    try:
        for kind, strategy in (
            ("sharded", FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type="sharded")),
            ("full", "single_device"),
        ):
            recorder = fsdp_runs.Recorder()
            trainer = quiet_trainer(strategy=strategy, devices=1, max_epochs=3, callbacks=[recorder])
            path = runs["out"] / f"{kind}-halves" / "checkpoints" / "epoch=1-step=24.ckpt"
            trainer.fit(common.Net("adam", lr=0.01, dropout=0.3), loader, ckpt_path=path)
            expected = runs[f"resume_{kind}"][0]
            assert max_abs_diff(recorder.start, expected["first_half"]) == 0.0, kind
            _equal_optimizer_states(recorder.optimizer_start, expected["first_half_optimizer"])
            assert trainer.global_step == 24 + 12 and trainer.world_size == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert rank0["restored_step"] == 24


def test_a_sharded_checkpoint_holding_code_is_refused_and_nothing_runs(runs, scripts, tmp_path, monkeypatch):
    """A sharded directory whose ``.metadata`` (torch unpickles it with ``pickle.load``) or ``meta.pt`` was replaced
    by one holding code: the resume is refused, naming the directory and weights_only=False; nothing runs."""
    common, fsdp_runs = scripts
    marker = tmp_path / "ran"
    payload = pickle.dumps(Payload(marker))
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    try:
        for name in (".metadata", "meta.pt"):
            path = tmp_path / name / "last.ckpt"
            shutil.copytree(runs["out"] / "sharded-halves" / "checkpoints" / "epoch=1-step=24.ckpt", path)
            if name == ".metadata":
                (path / name).write_bytes(payload)
            else:
                torch.save({"tandem_version": "0.1.0", "x": Payload(marker)}, path / name)
            strategy = FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type="sharded")
            trainer = quiet_trainer(strategy=strategy, devices=1, max_epochs=3)
            with pytest.raises(CheckpointError, match=r"(?s)not loaded: it holds .*exec.*weights_only=False") as caught:
                trainer.fit(common.Net("adam"), DataLoader(common.dataset(8), batch_size=4), ckpt_path=path)
            assert str(path) in str(caught.value) and not marker.exists(), name
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_sharded_checkpoint_of_two_ranks_resumes_mid_epoch_on_one_with_twice_the_batch(runs, scripts, monkeypatch):
    """Elastic resume 2 -> 1 under FSDP: the sharded directory saved mid-epoch by 2 ranks x batch 4 (resharded by
    torch.distributed.checkpoint) continues on one FSDP process x batch 8 to the uninterrupted run's weights."""
    (common, fsdp_runs), expected = scripts, runs["elastic"][0]["whole"]
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    loader = DataLoader(common.dataset(fsdp_runs.RESUME_SAMPLES), batch_size=2 * common.BATCH, shuffle=True)
    tandem.seed_everything(99)  # the checkpoint decides the order
    strategy = FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type="sharded")
    trainer = quiet_trainer(strategy=strategy, devices=1, max_epochs=2)
    try:
        trainer.fit(common.Net("adam", lr=0.01), loader, ckpt_path=runs["out"] / "elastic-fsdp.ckpt")
        assert trainer.global_step == 24
        got = fsdp_runs.full_weights(trainer)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert max_abs_diff(got, expected) <= 1e-6, max_abs_diff(got, expected)


def test_a_killed_sharded_save_is_removed_by_the_next_save_in_its_folder(tmp_path, monkeypatch):
    """A job SIGKILLed while writing a sharded last.ckpt leaves a full-size temporary directory; the next run's
    save into that folder (last-v1.ckpt: last.ckpt exists) removes it. (A resume's sweep: test_resume.py and
    test_checkpoint_io.py.)"""
    folder = killed_mid_save(tmp_path, "sharded")
    (stale,) = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert stale.name.startswith(".last.ckpt.") and (stale / "__0_0.distcp").is_file()  # every shard, not renamed
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    strategy = FSDPStrategy(state_dict_type="sharded")
    callbacks = [ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)]
    try:
        with pytest.warns(TandemWarning, match="exists and is not empty: it holds 1 checkpoint.s. of another run"):
            quiet_trainer(strategy=strategy, devices=1, max_epochs=1, callbacks=callbacks).fit(TinyModule(), loader())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert not stale.exists()
    assert sorted(p.name for p in folder.iterdir()) == ["last-v1.ckpt", "last.ckpt"]


def test_a_save_killed_between_the_renames_of_last_ckpt_resumes_from_the_previous_one(tmp_path, monkeypatch):
    """SIGKILLed while replacing a sharded last.ckpt, after the previous one was renamed aside and before the new
    one was renamed onto it: no last.ckpt is left, yet fit(ckpt_path="last") resumes from the previous one (the end
    of epoch 0, step 4), not from step 0, and nothing the killed save left remains in its folder."""
    folder = killed_mid_save(tmp_path, "swap")
    assert sorted(p.suffix for p in folder.iterdir()) == [".old", ".tmp"]  # the previous one aside, the new one
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    started: list[int] = []

    class Start(tandem.Callback):
        def on_train_start(self, trainer: tandem.Trainer, module: tandem.TrainingModule) -> None:
            started.append(trainer.global_step)

    trainer = quiet_trainer(
        strategy=FSDPStrategy(state_dict_type="sharded"),
        devices=1,
        max_epochs=3,
        default_root_dir=tmp_path,
        logger=True,
        enable_checkpointing=True,
        callbacks=[Start()],
    )
    try:
        trainer.fit(TinyModule(), loader(), ckpt_path="last")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert started == [4] and trainer.global_step == 12
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]


def _equal_optimizer_states(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["state"].keys() == b["state"].keys() and a["state"]
    for index, state in a["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["state"][index][key]), (index, key)
    assert [g["params"] for g in a["param_groups"]] == [g["params"] for g in b["param_groups"]]


# ---------------------------------------------------------------------------------------------- launch


def test_a_failing_rank_ends_the_job(runs):
    assert runs["returncode"] == 1
    assert "[tandem] rank 1 exited with code 1; stopping the other ranks." in runs["output"]
    assert "RuntimeError: fsdp-crash-test: rank 1 fails on purpose" in runs["output"]


def test_spawn_brings_the_gathered_weights_back(scripts, monkeypatch):
    common, fsdp_runs = scripts
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    torch.manual_seed(0)
    reference = common.Net("sgd")
    expected = _one_process(common, reference, 2 * common.BATCH, max_epochs=2)
    torch.manual_seed(0)
    model = common.Net("sgd")
    strategy = FSDPStrategy(auto_wrap_policy={nn.Linear}, start_method="spawn")
    trainer = quiet_trainer(strategy=strategy, devices=2, max_epochs=2, data_order="global")  # one process's order
    trainer.fit(model, DataLoader(common.dataset(common.TRAIN_SAMPLES), batch_size=common.BATCH))
    assert max_abs_diff(common.weights(model), expected) <= 1e-6
    assert set(trainer.callback_metrics) == {"train_loss"}


def test_bf16_true_shards_train_in_bfloat16(runs):
    rank0, rank1 = runs["true_half"]
    for result in (rank0, rank1):
        assert result["shards"] == {torch.bfloat16} and result["default_dtype"] == torch.float32
        assert result["losses"][-1] < result["losses"][0], result["losses"]
    assert rank0["saved"] == {torch.bfloat16}  # the whole weights, gathered in bfloat16


def test_a_compiled_fsdp_fit_trains_and_validates_as_the_eager_one(runs):
    """``trainer.fit(torch.compile(module))`` under fsdp (backend aot_eager): the root compiled around the sharded
    module ends with the eager fit's whole weights and validation results (101 samples: uneven ranks)."""
    for rank in runs["compiled"]:
        assert rank["graphs"] > 0
        assert rank["compiled"]["validate"] == rank["eager"]["validate"]
    rank0 = runs["compiled"][0]
    assert max_abs_diff(rank0["eager"]["final"], rank0["compiled"]["final"]) < 1e-6
