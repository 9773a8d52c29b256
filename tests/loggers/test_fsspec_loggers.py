"""TensorBoardLogger and CSVLogger with an fsspec URL save_dir (``memory://`` here; ``s3://``, ``gs://`` the same
way): the files land at ``<url>/<name>/version_<n>`` as they would in a local folder."""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import pickle

import pytest

from helpers import TinyModule, loader, quiet_trainer
from tandem.loggers import CSVLogger, TensorBoardLogger
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import rank_zero_only

fsspec = pytest.importorskip("fsspec")

ROOT = "/tandem-logs-test"
URL = f"memory:/{ROOT}"


@pytest.fixture
def memory():
    fs = fsspec.filesystem("memory")
    if fs.exists(ROOT):
        fs.rm(ROOT, recursive=True)
    yield fs
    if fs.exists(ROOT):
        fs.rm(ROOT, recursive=True)


def _files(fs, folder: str) -> list[str]:
    return sorted(path[len(folder) + 1 :] for path in fs.find(folder))


def _rows(fs, path: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(fs.cat(path).decode())))


def _fit(logger, epochs: int = 2, **kwargs) -> None:
    quiet_trainer(max_epochs=epochs, logger=logger, log_every_n_steps=1, **kwargs).fit(TinyModule(), loader())


def test_csv_logger_writes_metrics_and_hparams_at_the_url_and_the_next_fit_gets_version_1(memory) -> None:
    logger = CSVLogger(f"{URL}/runs", name="exp")
    _fit(logger)
    assert logger.log_dir == f"{URL}/runs/exp/version_0"
    assert logger.metrics_file_path == f"{URL}/runs/exp/version_0/metrics.csv"
    version_0 = f"{ROOT}/runs/exp/version_0"
    assert _files(memory, version_0) == ["hparams.yaml", "metrics.csv"]
    rows = _rows(memory, f"{version_0}/metrics.csv")
    assert [row["step"] for row in rows] == [str(step) for step in range(8)]  # 2 epochs of 4 batches
    assert all(float(row["train_loss"]) > 0 for row in rows)
    assert "lr: 0.1" in memory.cat(f"{version_0}/hparams.yaml").decode()

    second = CSVLogger(f"{URL}/runs", name="exp")
    _fit(second, epochs=1)
    assert second.version == 1  # read from the versions at the URL
    assert len(_rows(memory, f"{ROOT}/runs/exp/version_1/metrics.csv")) == 4


def test_csv_logger_resumed_at_a_url_appends_to_the_metrics_there(memory) -> None:
    _fit(CSVLogger(URL, name="exp", version=0), epochs=1)
    _fit(CSVLogger(URL, name="exp", version=0), epochs=1)  # a new process would start the same way
    rows = _rows(memory, f"{ROOT}/exp/version_0/metrics.csv")
    assert [row["step"] for row in rows] == ["0", "1", "2", "3"] * 2


def test_tensorboard_logger_event_file_at_the_url_holds_the_logged_scalar(memory, tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(URL, name="tb")
    _fit(logger, epochs=1)
    assert logger.log_dir == f"{URL}/tb/version_0"
    names = _files(memory, f"{ROOT}/tb/version_0")
    events = [name for name in names if name.startswith("events.out.tfevents.")]
    assert len(events) == 1 and "hparams.yaml" in names
    memory.get_file(f"{ROOT}/tb/version_0/{events[0]}", str(tmp_path / events[0]))
    accumulator = EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [event.step for event in accumulator.Scalars("train_loss")] == [0, 1, 2, 3]


def test_default_root_dir_url_holds_the_default_loggers_files_and_the_checkpoints(memory, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = quiet_trainer(max_epochs=1, logger=True, enable_checkpointing=True, default_root_dir=f"{URL}/root")
    trainer.fit(TinyModule(), loader())
    assert trainer.log_dir == f"{URL}/root/tandem_logs/version_0"
    names = _files(memory, f"{ROOT}/root/tandem_logs/version_0")
    assert "checkpoints/epoch=0-step=4.ckpt" in names and "hparams.yaml" in names  # Lightning's default file
    assert any(name.startswith("events.out.tfevents.") for name in names)
    assert os.listdir(tmp_path) == []  # nothing in the working directory


def test_the_clis_config_goes_to_a_url_log_dir_and_a_different_one_there_is_refused(memory, tmp_path, monkeypatch):
    """SaveConfigCallback under a URL default_root_dir: config.yaml at the URL (no local ``memory:`` folder), and a
    different config already there is found (before, os.path.isfile never saw it)."""
    from tandem.cli import SaveConfigCallback
    from tandem.cli.errors import CLIError
    from tandem.cli.save_config import saved_text

    monkeypatch.chdir(tmp_path)
    trainer = quiet_trainer(max_epochs=1, logger=True, default_root_dir=f"{URL}/cli")
    trainer.fit(TinyModule(), loader(), ckpt_path=None)
    SaveConfigCallback("lr: 0.1\n").setup(trainer, TinyModule(), "fit")
    assert memory.cat_file(f"{ROOT}/cli/tandem_logs/version_0/config.yaml") == saved_text("lr: 0.1\n").encode()
    assert os.listdir(tmp_path) == []
    with pytest.raises(CLIError, match="already holds a different config"):
        SaveConfigCallback("lr: 0.2\n").setup(trainer, TinyModule(), "fit")


def test_a_failed_run_uploads_what_it_logged(memory) -> None:
    class FailsAtStep3(TinyModule):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    logger = CSVLogger(URL, name="exp", flush_logs_every_n_steps=100)  # no flush before the failure
    with pytest.raises(RuntimeError, match="boom"):
        quiet_trainer(max_epochs=1, logger=logger, log_every_n_steps=1).fit(FailsAtStep3(), loader())
    assert [row["step"] for row in _rows(memory, f"{ROOT}/exp/version_0/metrics.csv")] == ["0", "1", "2"]


def test_only_global_rank_zero_writes_to_the_url(memory, monkeypatch) -> None:
    logger = CSVLogger(URL, name="exp", version=0)
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert not memory.exists(ROOT) and logger._staging is None


def test_a_used_url_logger_pickles_and_the_copy_uploads_from_its_own_staging_folder(memory) -> None:
    logger = TensorBoardLogger(URL, name="tb", version=0)
    logger.log_metrics({"loss": 1.0}, step=0)
    copy = pickle.loads(pickle.dumps(logger))  # as for a spawned process
    copy.log_metrics({"loss": 0.5}, step=1)
    copy.finalize("success")
    logger.finalize("success")
    events = [name for name in _files(memory, f"{ROOT}/tb/version_0") if name.startswith("events.")]
    assert len(events) == 2


def test_a_url_whose_filesystem_fsspec_cannot_open_names_the_fix() -> None:
    with pytest.raises(TandemConfigError, match=r"CSVLogger\(save_dir='nosuchfs://b/runs'\): fsspec has no filesystem"):
        CSVLogger("nosuchfs://b/runs")
    if importlib.util.find_spec("s3fs") is None:  # a known protocol whose package is missing
        with pytest.raises(TandemConfigError, match=r"pip install s3fs"):
            TensorBoardLogger("s3://bucket/runs")
