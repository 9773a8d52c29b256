import os
import pickle
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from helpers import TinyModule, loader, quiet_trainer
from tandem.loggers import TensorBoardLogger


def _events(log_dir):
    accumulator = EventAccumulator(log_dir)
    accumulator.Reload()
    return accumulator


def test_scalars_and_hparams_are_readable_back_from_one_run(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="exp", default_hp_metric=False)
    optim = {"name": "sgd", "nesterov": True}
    logger.log_hyperparams({"lr": 0.1, "optim": optim, "path": Path("/x"), "none": None})
    for step in range(3):
        logger.log_metrics({"train_loss": 1.0 / (step + 1), "epoch": 0.0}, step=step * 10)
    logger.save()
    logger.finalize("success")

    log_dir = str(tmp_path / "exp" / "version_0")
    assert logger.log_dir == log_dir
    files = os.listdir(log_dir)
    assert "hparams.yaml" in files
    assert all(not os.path.isdir(os.path.join(log_dir, f)) for f in files)  # no add_hparams sub-run

    events = _events(log_dir)
    loss = events.Scalars("train_loss")
    assert [e.step for e in loss] == [0, 10, 20]
    assert [round(e.value, 4) for e in loss] == [1.0, 0.5, 0.3333]
    assert [e.value for e in events.Scalars("epoch")] == [0.0, 0.0, 0.0]
    # one event per log_metrics call, holding every value (one event per value costs ~27 us each to write)
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (event_file,) = (f for f in files if "tfevents" in f)
    written = EventFileLoader(os.path.join(log_dir, event_file)).Load()
    scalar_events = [e for e in written if e.summary.value and not e.summary.value[0].tag.startswith("_hparams_")]
    assert [(e.step, [v.tag for v in e.summary.value]) for e in scalar_events] == [
        (step, ["train_loss", "epoch"]) for step in (0, 10, 20)
    ]

    content = events.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["lr"].number_value == 0.1
    assert start.hparams["optim/name"].string_value == "sgd"
    assert start.hparams["optim/nesterov"].number_value == 1  # torch writes bools as numbers
    assert start.hparams["path"].string_value == "/x"
    assert start.hparams["none"].string_value == "None"


def test_experiment_is_the_summary_writer_created_on_first_use(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    logger = TensorBoardLogger(tmp_path, flush_secs=1)
    assert not tmp_path.joinpath("tandem_logs").exists()
    writer = logger.experiment
    assert isinstance(writer, SummaryWriter) and logger.experiment is writer
    assert writer.log_dir == logger.log_dir
    writer.add_text("note", "hello", 0)
    logger.finalize("success")
    assert _events(logger.log_dir).Tags()["tensors"] == ["note/text_summary"]


def test_scalar_events_are_the_bytes_protobuf_writes_and_their_records_check(tmp_path):
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from tandem.loggers.tensorboard import EventFile
    from tandem.loggers.tensorboard import masked_crc32c as tandem_crc

    for data in (b"", b"a", bytes(range(256)) * 3):
        assert tandem_crc(data) == masked_crc32c(data)
    events = EventFile(str(tmp_path))
    cases = [
        (0, {"loss": 0.5, "epoch": 0}),
        (49, {"loss": 0.25, "epoch": 1}),  # the same names again: the cached layout
        (123456, {"a/b": 1e39, "é": float("nan"), "x" * 200: -3.25}),  # beyond float32, unicode, a long tag
        (-3, {"l": -1e300}),
    ]
    for step, values in cases:
        events.add_scalars(values, step)
        encoded = events._pending[-1]
        wall_time = Event.FromString(encoded).wall_time
        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        assert encoded == Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()
    events.close()
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    read = [e for e in EventFileLoader(events.path).Load() if e.summary.value]  # checks every record's checksums
    assert [e.step for e in read] == [step for step, _ in cases]


def test_publishing_writes_in_the_callers_thread_and_the_summary_writer_shares_the_file(tmp_path):
    import threading

    logger = TensorBoardLogger(tmp_path)
    before = threading.active_count()
    for step in range(5):
        logger.log_metrics({"loss": 1.0 / (step + 1), "epoch": 0}, step=step)
    assert threading.active_count() == before  # no writer thread to take the interpreter from the next batch
    logger.experiment.add_histogram("w", torch.arange(4.0), 3)  # the SummaryWriter, made after the first values
    logger.log_metrics({"loss": 0.1, "epoch": 1}, step=5)
    logger.finalize("success")
    files = [f for f in os.listdir(logger.log_dir) if "tfevents" in f]
    assert len(files) == 1  # one file per run: TensorBoard reads a run's files one after the other
    events = _events(logger.log_dir)
    assert [e.step for e in events.Scalars("loss")] == [0, 1, 2, 3, 4, 5]
    assert events.Tags()["histograms"] == ["w"]


def test_a_used_logger_can_be_pickled_for_spawned_processes(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    logger.log_metrics({"a": 1.0}, step=0)
    clone = pickle.loads(pickle.dumps(logger))
    assert clone.log_dir == logger.log_dir and clone.version == 0
    logger.finalize("success")


def _post(url: str, body: dict) -> dict:
    import json
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.mark.timeout(60)
def test_tensorboards_hparams_tab_compares_runs_by_their_metrics(tmp_path):
    """Two runs with different lr, read back from a real TensorBoard server over HTTP."""
    from tensorboard import program

    for version, (lr, loss) in enumerate([(0.1, 0.5), (0.01, 0.25)]):
        logger = TensorBoardLogger(tmp_path, name="exp", version=version, default_hp_metric=False)
        logger.log_hyperparams({"lr": lr, "optimizer": "sgd"})
        for step in range(3):
            logger.log_metrics({"train_loss": 1.0 + step, "val_loss": loss + step}, step=step)
        logger.finalize("success" if version == 0 else "failed")

    server = program.TensorBoard()
    argv = [None, "--logdir", str(tmp_path), "--port", "0", "--load_fast", "false", "--reload_interval", "0"]
    server.configure(argv=argv)  # the files are complete: read them once, no polling thread left behind
    url = server.launch() + "data/plugin/hparams/"
    deadline = time.monotonic() + 30
    while True:  # the server reads the event files in the background
        experiment = _post(url + "experiment", {"experimentName": ""})
        if len(experiment.get("metricInfos", [])) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sorted(m["name"]["tag"] for m in experiment["metricInfos"]) == ["train_loss", "val_loss"]
    lr = next(h for h in experiment["hparamInfos"] if h["name"] == "lr")
    assert lr["differs"] and lr["domainInterval"] == {"minValue": 0.01, "maxValue": 0.1}  # both runs' values

    statuses = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
    query = {"experimentName": "", "allowedStatuses": statuses, "colParams": [], "startIndex": 0, "sliceSize": 10}
    groups = {g["name"]: g for g in _post(url + "session_groups", query)["sessionGroups"]}
    assert sorted(groups) == ["exp/version_0", "exp/version_1"]
    final = {name: {m["name"]["tag"]: m["value"] for m in g["metricValues"]} for name, g in groups.items()}
    assert final["exp/version_0"] == {"train_loss": 3.0, "val_loss": 2.5}  # the last value of each metric
    assert final["exp/version_1"] == {"train_loss": 3.0, "val_loss": 2.25}
    assert groups["exp/version_0"]["hparams"]["lr"] == 0.1
    assert groups["exp/version_1"]["sessions"][0]["status"] == "STATUS_FAILURE"


def test_log_graph_adds_the_graph_traced_with_the_modules_example_input(tmp_path):
    module = TinyModule()
    module.example_input_array = torch.zeros(2, 8)
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    quiet_trainer(logger=logger, max_epochs=1).fit(module, loader())
    graph = _events(logger.log_dir).Graph()
    scopes = {node.name.rsplit("/", 1)[0] for node in graph.node}  # the layers, without tracer numbering
    net = "TinyModule/Sequential[net]"
    assert {"input", "output", f"{net}/Linear[0]", f"{net}/ReLU[2]", f"{net}/Linear[3]/weight"} <= scopes


def test_log_graph_is_off_by_default_and_warns_without_an_example_input(tmp_path):
    module = TinyModule()
    module.example_input_array = torch.zeros(2, 8)
    logger = TensorBoardLogger(tmp_path)
    quiet_trainer(logger=logger, max_epochs=1).fit(module, loader())
    assert not _events(logger.log_dir).Tags()["graph"]

    logger = TensorBoardLogger(tmp_path, log_graph=True)
    with pytest.warns(UserWarning, match="the module has no example_input_array"):
        logger.log_graph(TinyModule())
    with pytest.warns(UserWarning, match="example_input_array is a list"):
        logger.log_graph(module, [torch.zeros(2, 8)])
    assert not tmp_path.joinpath("tandem_logs", "version_1").exists()


def test_log_hyperparams_logs_lightnings_placeholder_hp_metric(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="exp")
    logger.log_hyperparams({"lr": 0.1})  # no metrics: hp_metric -1, as Lightning's default_hp_metric=True
    logger.log_hyperparams({"lr": 0.1}, metrics=0.25, step=3)  # a number is the hp_metric
    logger.log_hyperparams({"lr": 0.1}, metrics={"val_best": 0.5}, step=4)
    TensorBoardLogger(tmp_path, name="off", default_hp_metric=False).log_hyperparams({"lr": 0.1})
    logger.finalize("success")

    events = _events(str(tmp_path / "exp" / "version_0"))
    assert [(e.step, e.value) for e in events.Scalars("hp_metric")] == [(0, -1.0), (3, 0.25)]
    assert [(e.step, e.value) for e in events.Scalars("val_best")] == [(4, 0.5)]
    assert "hp_metric" not in _events(str(tmp_path / "off" / "version_0")).Tags()["scalars"]


def test_the_run_folder_holds_hparams_yaml_even_when_no_hyperparameters_were_logged(tmp_path):
    class Unsaved(TinyModule):
        def __init__(self):
            super().__init__()
            self._log_hyperparams = False  # as if save_hyperparameters() had not been called

    logger = TensorBoardLogger(tmp_path, default_hp_metric=False)
    trainer = quiet_trainer(max_steps=1, logger=logger, log_every_n_steps=1)  # a row: the run folder exists
    trainer.fit(Unsaved(), loader(32, 16))
    assert (tmp_path / "tandem_logs" / "version_0" / "hparams.yaml").read_text().strip() == "{}"  # Lightning's
