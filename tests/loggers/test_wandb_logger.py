"""WandbLogger in W&B's offline mode (no network): the run's records are read back from its ``.wandb`` file."""

import json
import os

import pytest
import torch

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.utilities.rank_zero import rank_zero_only

wandb = pytest.importorskip("wandb")
from wandb_records import config, finish, history, run_records  # noqa: E402

from tandem.loggers import WandbLogger  # noqa: E402


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, quiet, with its caches and settings in tmp_path; any run still open is finished after."""
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    yield tmp_path
    if wandb.run is not None:
        wandb.finish()


def _fit(logger, root, epochs=2, checkpoint=None, module=None):
    trainer = quiet_trainer(
        logger=logger,
        max_epochs=epochs,
        log_every_n_steps=1,
        default_root_dir=root,
        enable_checkpointing=checkpoint is not None,
        callbacks=[checkpoint] if checkpoint is not None else [],
    )
    trainer.fit(module or TinyModule(lr=0.05), loader(), loader(32))
    return trainer


def test_a_fit_logs_config_and_metrics_against_the_global_step(offline):
    logger = WandbLogger(name="first", project="proj", save_dir=offline, prefix="fit")
    trainer = _fit(logger, offline, checkpoint=ModelCheckpoint())
    run = logger.experiment
    assert run.id == logger.version and run.name == "first" and run.project == "proj"
    finish(logger)

    records = run_records(offline)
    assert records["run"][0].run.run_id == logger.version
    assert config(records) == {"lr": 0.05, "optimizer": "sgd", "dropout": 0.0, "scheduler": False}
    rows = history(records)
    train = [(row["trainer/global_step"], row["fit-train_loss"]) for row in rows if "fit-train_loss" in row]
    assert [step for step, _ in train] == list(range(8))  # Lightning's steps
    assert all(isinstance(loss, float) and loss > 0 for _, loss in train)
    validation = [(row["trainer/global_step"], row["fit-epoch"]) for row in rows if "fit-val_loss" in row]
    assert validation == [(3, 0), (7, 1)]  # at the last batch's step (Lightning's)
    # checkpoints go to <save_dir>/<project>/<run id>/checkpoints, as in Lightning
    assert trainer.log_dir == os.path.join(str(offline), "proj", logger.version)
    assert os.listdir(os.path.join(trainer.log_dir, "checkpoints")) == ["epoch=1-step=8.ckpt"]


@pytest.mark.parametrize(
    ("log_model", "logged"),
    [("all", ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]), (True, ["epoch=1-step=8.ckpt"])],
)
def test_log_model_logs_checkpoints_as_model_artifacts(offline, log_model, logged):
    logger = WandbLogger(project="proj", save_dir=offline, log_model=log_model)
    checkpoint = ModelCheckpoint(save_top_k=1)  # without a monitor the newest file is kept, the older deleted
    _fit(logger, offline, checkpoint=checkpoint)
    finish(logger)

    artifacts = [r.artifact for r in run_records(offline)["artifact"]]
    assert [json.loads(a.metadata)["original_filename"] for a in artifacts] == logged
    last = artifacts[-1]
    assert last.name == f"model-{logger.version}" and last.type == "model"
    assert set(last.aliases) == {"latest", "best"}
    assert json.loads(last.metadata)["ModelCheckpoint"]["save_top_k"] == 1
    (entry,) = last.manifest.contents
    assert entry.path == "model.ckpt"
    with open(checkpoint.best_model_path, "rb") as kept, open(entry.local_path, "rb") as staged:
        assert staged.read() == kept.read()  # the bytes `wandb sync` uploads


def test_watch_logs_gradient_histograms(offline):
    logger = WandbLogger(project="proj", save_dir=offline)
    module = TinyModule()
    logger.watch(module, log="gradients", log_freq=1, log_graph=False)
    _fit(logger, offline, epochs=1, module=module)
    finish(logger)
    keys = set().union(*history(run_records(offline)))
    assert {"gradients/net.0.weight", "gradients/net.3.bias"} <= keys


def test_the_run_id_is_fixed_before_the_run_starts_and_other_ranks_start_none(offline):
    logger = WandbLogger(project="proj", save_dir=offline)
    version = logger.version  # what the Trainer broadcasts: rank 0 picks the id, starts no run
    assert isinstance(version, str) and len(version) == 8 and logger.version == version
    assert logger.log_dir == os.path.join(str(offline), "proj", version)
    assert not os.path.exists(offline / "wandb") and wandb.run is None

    other = WandbLogger(project="proj", save_dir=offline)
    rank_zero_only.rank = 1
    try:
        assert other.version is None
        other.log_hyperparams({"lr": 0.1})
        other.log_metrics({"loss": 1.0}, step=0)
        other.experiment.config["lr"] = 0.1  # a no-op stand-in, not a run
        other.watch(torch.nn.Linear(2, 2))
        other.version = version  # what the Trainer's broadcast does
        other.finalize("success")
    finally:
        rank_zero_only.rank = 0
    assert other.version == version
    assert not os.path.exists(offline / "wandb") and wandb.run is None

    logger.log_metrics({"loss": 1.0}, step=0)  # the first write starts the run, with the id given out
    assert logger.experiment.id == version


def test_the_cli_takes_it_by_its_short_name(offline):
    from tandem.cli import CLI

    args = [f"--trainer.default_root_dir={offline}", "--trainer.accelerator=cpu", "--trainer.logger=WandbLogger"]
    cli = CLI(
        TinyModule, run=False, args=[*args, "--trainer.logger.project=cli", f"--trainer.logger.save_dir={offline}"]
    )
    assert isinstance(cli.trainer.logger, WandbLogger) and cli.trainer.logger.name == "cli"


def test_tables_text_and_images_are_logged_at_the_step_given(offline):
    logger = WandbLogger(project="proj", save_dir=offline)
    logger.log_text("samples", columns=["input", "label"], data=[["cheese", "english"]], step=3)
    logger.log_image("pictures", [torch.zeros(3, 4, 4), torch.ones(3, 4, 4)], step=5, caption=["dark", "light"])
    with pytest.raises(ValueError, match="2 images but 1 values of 'caption'"):
        logger.log_image("pictures", [torch.zeros(3, 4, 4)] * 2, caption=["one"])
    finish(logger)

    rows = history(run_records(offline))
    table = next(row for row in rows if "samples" in row)
    assert table["trainer/global_step"] == 3 and table["samples"]["_type"] == "table-file"
    assert table["samples"]["ncols"] == 2 and table["samples"]["nrows"] == 1
    images = next(row for row in rows if "pictures" in row)
    assert images["trainer/global_step"] == 5
    assert images["pictures"]["count"] == 2 and images["pictures"]["captions"] == ["dark", "light"]
