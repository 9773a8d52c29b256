import csv
import errno
import os

import pytest

from helpers import TinyModule, loader, quiet_trainer
from tandem.loggers import CSVLogger
from tandem.loggers import csv as csv_module
from tandem.loggers import logger as logger_module
from tandem.utilities.exceptions import FileWriteError, TandemConfigError


def _read(logger):
    with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as f:
        return list(csv.reader(f))


def test_columns_are_the_sorted_union_of_keys_and_grow_mid_run(tmp_path):
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"train_loss": 1.5, "epoch": 0}, step=0)
    logger.log_metrics({"train_loss": 1.25, "epoch": 0.0}, step=1)
    logger.save()
    assert _read(logger) == [["epoch", "step", "train_loss"], ["0", "0", "1.5"], ["0", "1", "1.25"]]

    logger.log_metrics({"train_loss": 1.0, "epoch": 1}, step=2)
    logger.save()  # same columns: appended
    logger.log_metrics({"val_loss": 2.0, "epoch": 1}, step=2)  # a new key: the file is rewritten, sorted
    logger.finalize("success")
    assert _read(logger) == [
        ["epoch", "step", "train_loss", "val_loss"],
        ["0", "0", "1.5", ""],
        ["0", "1", "1.25", ""],
        ["1", "2", "1.0", ""],
        ["1", "2", "", "2.0"],
    ]


def test_a_fit_writes_lightnings_table_epoch_and_step_on_every_row(tmp_path):
    logger = CSVLogger(tmp_path)
    trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=2)
    trainer.fit(TinyModule(), loader(64, 16), loader(32, 16))
    with open(logger.metrics_file_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["epoch", "step", "train_loss", "val_acc", "val_loss"]  # sorted, as Lightning's
    assert all(row["epoch"] in ("0", "1") and row["step"].isdigit() for row in rows)
    # Lightning's table, row for row: the first window at step log_every_n_steps - 1, an epoch's validation at its
    # last batch's step, and no row holding only an epoch (nothing was logged for the training epoch)
    filled = [(r["epoch"], r["step"], sorted(k for k in ("train_loss", "val_loss") if r[k])) for r in rows]
    assert filled == [
        ("0", "1", ["train_loss"]),
        ("0", "3", ["train_loss"]),
        ("0", "3", ["val_loss"]),
        ("1", "5", ["train_loss"]),
        ("1", "7", ["train_loss"]),
        ("1", "7", ["val_loss"]),
    ]


def test_rows_are_flushed_every_n_steps_without_waiting_for_save(tmp_path):
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=10)
    for step in range(0, 10, 5):
        logger.log_metrics({"loss": float(step)}, step=step)
    assert not os.path.exists(os.path.join(logger.log_dir, "metrics.csv"))
    logger.log_metrics({"loss": 10.0}, step=10)
    assert [row[1] for row in _read(logger)] == ["step", "0", "5", "10"]


def test_a_failed_rewrite_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()
    before = _read(logger)

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(logger_module.os, "replace", failing_replace)
    logger.log_metrics({"b": 2.0}, step=1)
    with pytest.raises(OSError, match="disk full"):
        logger.save()
    monkeypatch.undo()
    assert _read(logger) == before
    assert os.listdir(logger.log_dir) == ["metrics.csv"]  # the temporary file was removed


def test_a_resumed_run_appends_to_the_existing_file(tmp_path):
    first = CSVLogger(tmp_path, version=0)
    first.log_metrics({"loss": 1.0}, step=0)
    first.finalize("success")
    second = CSVLogger(tmp_path, version=0)
    second.log_metrics({"loss": 0.5}, step=1)
    second.finalize("success")
    assert _read(second) == [["loss", "step"], ["1.0", "0"], ["0.5", "1"]]


def test_the_file_is_byte_for_byte_the_csv_lightning_writes(tmp_path):
    """Lightning's metrics.csv has the csv module's "\r\n" line ends: a port's file compares with ``diff`` or ``cmp``
    line by line, also after a resumed run appends and after new columns rewrite it."""
    first = CSVLogger(tmp_path, version=0)
    first.log_metrics({"loss": 1.0}, step=0)
    first.finalize("success")
    second = CSVLogger(tmp_path, version=0)
    second.log_metrics({"loss": 0.5}, step=1)
    second.save()
    second.log_metrics({"acc": 0.25, "epoch": 0}, step=2)
    second.finalize("success")
    with open(os.path.join(second.log_dir, "metrics.csv"), "rb") as f:
        assert f.read() == b"acc,epoch,loss,step\r\n,,1.0,0\r\n,,0.5,1\r\n0.25,0,,2\r\n"


def test_flush_interval_must_be_positive(tmp_path):
    with pytest.raises(TandemConfigError, match="CSVLogger: flush_logs_every_n_steps=0 is out of range"):
        CSVLogger(tmp_path, flush_logs_every_n_steps=0)


def test_a_full_disk_is_reported_naming_the_metrics_file(tmp_path, monkeypatch):
    """Appending rows and rewriting the file alike: FileWriteError with the path and the cause."""
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(csv_module, "open", full_disk, raising=False)  # the append
    logger.log_metrics({"loss": 0.5}, step=1)
    with pytest.raises(FileWriteError, match=r"Could not write the metrics file '.*metrics.csv': No space left on"):
        logger.save()
    monkeypatch.undo()
    monkeypatch.setattr(logger_module.os, "replace", full_disk)  # a rewrite (new column) fails at the rename
    logger.log_metrics({"loss": 0.25, "acc": 0.5}, step=2)
    with pytest.raises(FileWriteError, match=r"metrics.csv': No space left on device \(ENOSPC\)\. The previous"):
        logger.save()


def test_experiment_is_lightnings_writer_and_add_image_names_what_csv_logs_and_tensorboard(tmp_path):
    """``logger.experiment`` as Lightning's CSVLogger has it (log_metrics, log_hparams, save); a TensorBoard call on
    it said only "no attribute 'experiment'"."""
    logger = CSVLogger(tmp_path)
    writer = logger.experiment
    writer.log_hparams({"lr": 0.1})
    writer.log_metrics({"f1": 0.5})  # no step: the number of rows not yet written (Lightning's)
    writer.log_metrics({"f1": 0.75}, step=7)
    assert writer.metrics == [{"f1": 0.5, "step": 0}, {"f1": 0.75, "step": 7}] and writer.hparams == {"lr": 0.1}
    writer.save()
    assert _read(logger) == [["f1", "step"], ["0.5", "0"], ["0.75", "7"]]
    assert writer.log_dir == logger.log_dir and writer.metrics_file_path == logger.metrics_file_path
    assert os.path.isfile(os.path.join(logger.log_dir, writer.NAME_HPARAMS_FILE))
    with pytest.raises(AttributeError, match=r"CSVLogger.experiment has no 'add_image'") as caught:
        logger.experiment.add_image("digits", None, 0)
    message = str(caught.value)
    assert "log_metrics(metrics, step), log_hparams(params) and save()" in message
    assert "TensorBoardLogger" in message and "Trainer(logger=[CSVLogger(...), TensorBoardLogger(...)])" in message
    assert not hasattr(logger.experiment, "add_histogram")  # still an AttributeError, for hasattr and getattr
