"""MLFlowLogger against a real local MLflow store, read back through ``MlflowClient``."""

import csv as csv_module
import os
import pickle

import pytest

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.loggers import CSVLogger
from tandem.loggers.logger import load_hparams_yaml
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import rank_zero_only

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from tandem.loggers import MLFlowLogger  # noqa: E402


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A file store in tmp_path (MLflow >= 3.13 refuses one without MLFLOW_ALLOW_FILE_STORE)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "mlruns"


def csv_rows(logger):
    with open(logger.metrics_file_path, encoding="utf-8") as f:
        return list(csv_module.DictReader(f))


def _fit(logger, root, epochs=2, checkpoint=None):
    trainer = quiet_trainer(
        logger=logger,
        max_epochs=epochs,
        log_every_n_steps=1,
        default_root_dir=root,
        enable_checkpointing=checkpoint is not None,
        callbacks=[checkpoint] if checkpoint is not None else [],
    )
    trainer.fit(TinyModule(lr=0.05), loader(), loader(32))
    return trainer


def test_a_fit_logs_params_metrics_tags_and_status_to_one_run(store, tmp_path):
    logger = MLFlowLogger(experiment_name="exp", run_name="first", tags={"team": "vision"}, save_dir=store)
    csv = CSVLogger(tmp_path, name="csv")  # a second logger: the same values as text
    trainer = _fit([logger, csv], tmp_path, checkpoint=ModelCheckpoint())

    client = MlflowClient(f"file:{store}")
    experiment = client.get_experiment_by_name("exp")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [logger.version]
    assert logger.name == experiment.experiment_id
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.runName"] == "first" and run.data.tags["team"] == "vision"
    assert run.data.params == {"lr": "0.05", "optimizer": "sgd", "dropout": "0.0", "scheduler": "False"}
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in history] == list(range(8))  # 4 batches an epoch, every step logged (Lightning's steps)
    rows = [row for row in csv_rows(csv) if row["train_loss"]]
    assert [m.value for m in history] == pytest.approx([float(row["train_loss"]) for row in rows])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [
        3,
        7,
    ]  # at the last batch's step (Lightning's)
    assert {m.value for m in client.get_metric_history(run.info.run_id, "epoch")} == {0.0, 1.0}
    # the checkpoints go into the run's folder of the store, as in Lightning
    run_folder = os.path.join(str(store), experiment.experiment_id, logger.version)
    assert trainer.log_dir == logger.log_dir == run_folder
    assert os.listdir(os.path.join(run_folder, "checkpoints")) == ["epoch=1-step=8.ckpt"]


@pytest.mark.parametrize(
    ("log_model", "logged"),
    [("all", ["epoch=0-step=4", "epoch=1-step=8"]), (True, ["epoch=1-step=8"])],  # True: the files kept at the end
)
def test_log_model_logs_checkpoints_as_artifacts(store, tmp_path, log_model, logged):
    logger = MLFlowLogger(experiment_name="exp", save_dir=store, log_model=log_model, checkpoint_path_prefix="ckpts")
    checkpoint = ModelCheckpoint(save_top_k=1)  # without a monitor the newest file is kept, the older deleted
    _fit(logger, tmp_path, checkpoint=checkpoint)

    client = MlflowClient(f"file:{store}")
    run_id = logger.version
    assert [a.path for a in client.list_artifacts(run_id, "ckpts")] == [f"ckpts/{name}" for name in logged]
    final = f"ckpts/{logged[-1]}"
    files = [a.path for a in client.list_artifacts(run_id, final)]
    assert files == [f"{final}/aliases.txt", f"{final}/{logged[-1]}.ckpt", f"{final}/metadata.yaml"]
    folder = client.download_artifacts(run_id, final, str(tmp_path / "download"))
    with open(checkpoint.best_model_path, "rb") as kept, open(f"{folder}/{logged[-1]}.ckpt", "rb") as artifact:
        assert artifact.read() == kept.read()
    metadata = load_hparams_yaml(f"{folder}/metadata.yaml")
    assert (
        metadata["original_filename"] == f"{logged[-1]}.ckpt" and metadata["score"] is None
    )  # no monitor: no score, as Lightning
    assert metadata["ModelCheckpoint"]["save_top_k"] == 1
    with open(f"{folder}/aliases.txt", encoding="utf-8") as aliases:
        assert aliases.read() == "['latest', 'best']"


def test_prefix_metric_names_statuses_and_logging_into_an_existing_run(store):
    first = MLFlowLogger(experiment_name="exp", save_dir=store, prefix="train")
    renamed = pytest.warns(RuntimeWarning, match="'train-acc@1' as 'train-acc1'")
    with renamed, pytest.warns(UserWarning, match="skips the metric 'train-note'"):
        first.log_metrics({"loss": 1.0, "acc@1": 0.5, "note": "text"}, step=3)
    first.finalize("failed")
    client = MlflowClient(f"file:{store}")
    assert client.get_run(first.version).info.status == "FAILED"

    again = MLFlowLogger(save_dir=store, run_id=first.version, prefix="train")
    again.log_metrics({"loss": 0.5}, step=4)
    assert again.name == first.name
    again.finalize("interrupted")
    run = client.get_run(first.version)
    assert run.info.status == "KILLED"
    assert sorted(run.data.metrics) == ["train-acc1", "train-loss"]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train-loss")] == [(3, 1.0), (4, 0.5)]


def test_nothing_is_written_before_use_nor_ever_on_other_ranks(store):
    logger = MLFlowLogger(save_dir=store)
    assert not store.exists()  # no client, no store until the first use
    rank_zero_only.rank = 1
    try:
        assert logger.version is None and logger.name is None and logger.log_dir is None
        logger.log_hyperparams({"lr": 0.1})
        logger.log_metrics({"loss": 1.0}, step=0)
        logger.experiment.log_param("run", "lr", 0.1)  # a no-op stand-in, not an MlflowClient
        logger.version = "0123abcd"  # what the Trainer's broadcast of rank 0's run id does
        assert logger.version == "0123abcd"
        logger.finalize("success")
    finally:
        rank_zero_only.rank = 0
    assert not store.exists()


def test_a_used_logger_can_be_pickled_for_spawned_processes(store):
    logger = MLFlowLogger(save_dir=store)
    logger.log_metrics({"loss": 1.0}, step=0)
    copy = pickle.loads(pickle.dumps(logger))
    copy.log_metrics({"loss": 0.5}, step=1)
    copy.finalize("success")
    history = MlflowClient(f"file:{store}").get_metric_history(logger.version, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5)]


def test_a_refused_file_store_names_both_fixes(tmp_path, monkeypatch):
    import mlflow.environment_variables

    if not hasattr(mlflow.environment_variables, "MLFLOW_ALLOW_FILE_STORE"):
        pytest.skip("this MLflow accepts file stores without MLFLOW_ALLOW_FILE_STORE")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = MLFlowLogger(save_dir=tmp_path / "mlruns")
    with pytest.raises(TandemConfigError, match=r"MLFLOW_ALLOW_FILE_STORE=true.*tracking_uri='sqlite:///mlflow.db'"):
        logger.log_metrics({"loss": 1.0}, step=0)


def test_the_cli_and_the_trainer_take_it_by_its_short_name(store, tmp_path):
    from tandem.cli import CLI

    args = [f"--trainer.default_root_dir={tmp_path}", "--trainer.accelerator=cpu", "--trainer.logger=MLFlowLogger"]
    cli = CLI(TinyModule, run=False, args=[*args, f"--trainer.logger.save_dir={store}"])
    assert isinstance(cli.trainer.logger, MLFlowLogger) and cli.trainer.logger.save_dir == str(store)
