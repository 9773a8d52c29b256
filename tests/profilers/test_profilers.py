"""Trainer(profiler=...): Lightning's profilers, their action names, reports and files."""

from __future__ import annotations

import gc
import json
import re
import time

import pytest
import torch

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.profilers import AdvancedProfiler, PassThroughProfiler, Profiler, PyTorchProfiler, SimpleProfiler
from tandem.utilities.exceptions import TandemConfigError

STEP = "[Strategy]SingleDeviceStrategy.training_step"


class Hooked(TinyModule):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        pass


class Watcher(tandem.Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        pass

    def on_validation_epoch_end(self, trainer, module):
        pass


def _row(report: str, action: str) -> list[str]:
    """The cells of ``action``'s row in a SimpleProfiler table."""
    (line,) = [line for line in report.splitlines() if line.startswith(f"|  {action} ") or f"|  {action}\t" in line]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_simple_profiler_times_every_hook_step_and_phase_with_lightnings_names(capsys):
    profiler = SimpleProfiler()
    trainer = quiet_trainer(
        max_epochs=2, limit_train_batches=3, limit_val_batches=2, callbacks=[Watcher()], profiler=profiler
    )
    trainer.fit(Hooked(), loader(64), loader(32))
    counts = {action: len(durations) for action, durations in profiler.recorded_durations.items()}
    batches = 2 * 3
    for action in (
        STEP,
        "[Strategy]SingleDeviceStrategy.backward",
        "[Strategy]SingleDeviceStrategy.optimizer_step",
        "[LightningModule]Hooked.optimizer_zero_grad",
        "[LightningModule]Hooked.on_train_batch_end",
        "[Callback]Watcher.on_train_batch_start",
        "run_training_batch",
    ):
        assert counts.get(action) == batches, (action, counts)
    assert counts["run_training_epoch"] == 2
    assert counts["[Strategy]SingleDeviceStrategy.validation_step"] == 2 * 2
    assert counts["[Callback]Watcher.on_validation_epoch_end"] == 2
    assert counts["[_TrainingEpochLoop].train_dataloader_next"] >= batches
    assert counts["[_EvaluationLoop].val_next"] >= 2 * 2
    assert counts["[Strategy]SingleDeviceStrategy.batch_to_device"] == batches + 2 * 2
    # the report, printed at the end of fit: Lightning's table, one row per action with its number of calls
    printed = capsys.readouterr().err
    assert "FIT Profiler Report" in printed
    assert _row(printed, STEP)[2] == str(batches)
    assert _row(printed, "[LightningModule]Hooked.on_train_batch_end")[2] == str(batches)
    assert _row(printed, "Total")[1:] == ["-", str(sum(counts.values())), _row(printed, "Total")[3], "100 %"]


def test_hooks_nobody_overrides_are_not_timed_and_a_manual_backward_is():
    class Manual(TinyModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.manual_backward(loss)
            self.optimizers().step()
            self.optimizers().zero_grad()

    profiler = SimpleProfiler()
    quiet_trainer(max_steps=3, profiler=profiler).fit(Manual(), loader(64))
    counts = {action: len(durations) for action, durations in profiler.recorded_durations.items()}
    assert counts[STEP] == counts["[Strategy]SingleDeviceStrategy.backward"] == 3
    assert counts["[Strategy]SingleDeviceStrategy.optimizer_step"] == 3
    assert not any("on_train_batch_end" in action for action in counts)  # nobody overrides it


def test_a_report_file_per_stage_in_the_log_folder(tmp_path):
    trainer = quiet_trainer(
        max_steps=2, profiler=SimpleProfiler(filename="perf", extended=False), default_root_dir=tmp_path
    )
    model = TinyModule()
    trainer.fit(model, loader(64))
    trainer.test(model, loader(32), verbose=False)
    fit, test = (tmp_path / "fit-perf.txt").read_text(), (tmp_path / "test-perf.txt").read_text()
    assert fit.startswith("FIT Profiler Report") and STEP in fit
    assert "Num calls" not in fit and "Mean duration (s)" in fit  # extended=False: mean and total only
    assert test.startswith("TEST Profiler Report") and "[Strategy]SingleDeviceStrategy.test_step" in test
    assert "[_EvaluationLoop].test_next" in test


def test_profiler_argument_resolves_names_and_refuses_others():
    assert isinstance(quiet_trainer().profiler, PassThroughProfiler)  # Lightning's default
    assert isinstance(quiet_trainer(profiler="simple").profiler, SimpleProfiler)
    assert isinstance(quiet_trainer(profiler="Advanced").profiler, AdvancedProfiler)
    assert isinstance(quiet_trainer(profiler="pytorch").profiler, PyTorchProfiler)
    mine = SimpleProfiler()
    assert quiet_trainer(profiler=mine).profiler is mine
    with pytest.raises(TandemConfigError, match=r"profiler='bogus'.*'simple', 'advanced', 'pytorch'.*Profiler"):
        quiet_trainer(profiler="bogus")


def test_a_pass_through_profiler_is_never_called():
    class Counting(PassThroughProfiler):
        calls = 0

        def start(self, action_name: str) -> None:
            Counting.calls += 1

    quiet_trainer(max_steps=3, profiler=Counting()).fit(Hooked(), loader(64), loader(32))
    assert Counting.calls == 0  # off means the loops' plain path, not a no-op call per action


def test_a_custom_profiler_gets_lightnings_setup_and_describe():
    class Recording(Profiler):
        def __init__(self):
            super().__init__()
            self.events = []

        def start(self, action_name):
            self.events.append(("start", action_name))

        def stop(self, action_name):
            self.events.append(("stop", action_name))

        def setup(self, stage, local_rank=None, log_dir=None):
            super().setup(stage, local_rank, log_dir)
            self.events.append(("setup", stage, local_rank))

        def summary(self):
            self.events.append(("summary",))
            return ""

    profiler = Recording()
    quiet_trainer(max_steps=1, profiler=profiler).fit(TinyModule(), loader(16))
    assert profiler.events[0] == ("setup", "fit", None) and profiler.events[-1] == ("summary",)
    assert ("start", STEP) in profiler.events and ("stop", STEP) in profiler.events


def test_simple_profiler_refuses_unpaired_actions():
    profiler = SimpleProfiler()
    profiler.start("a")
    with pytest.raises(ValueError, match="a which has already started"):
        profiler.start("a")
    with pytest.raises(ValueError, match=r"\(b\) which was never started"):
        profiler.stop("b")


def test_advanced_profiler_reports_cprofile_statistics_per_action(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="perf", line_count_restriction=10)
    quiet_trainer(max_steps=3, profiler=profiler).fit(TinyModule(), loader(64))
    report = (tmp_path / "fit-perf.txt").read_text()
    assert report.startswith("FIT Profiler Report")
    section = report.split(f"Profile stats for: {STEP}")[1].split("Profile stats for:")[0]
    assert "ncalls" in section and "cumtime" in section  # pstats' table
    assert re.search(r"helpers\.py:\d+\(training_step\)", section)  # the module's own step, from cProfile


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_advanced_profiler_records_the_outer_action_again_after_an_inner_one():
    profiler = AdvancedProfiler()
    profiler.start("outer")
    profiler.start("inner")
    profiler.stop("inner")
    _busy(0.01)
    profiler.stop("outer")
    report = profiler.summary()
    outer = report.split("Profile stats for: outer")[1].split("Profile stats for:")[0]
    assert "_busy" in outer  # ran after the inner action ended, inside the outer one


@pytest.mark.filterwarnings("ignore:The PyTorchProfiler default schedule")
def test_pytorch_profiler_writes_a_trace_that_tensorboard_reads(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="perf")
    quiet_trainer(max_steps=3, profiler=profiler).fit(TinyModule(), loader(64))
    traces = list(tmp_path.glob("fit-perf-*.pt.trace.json"))  # tensorboard_trace_handler's name
    assert len(traces) == 1, list(tmp_path.iterdir())
    names = {event.get("name") for event in json.loads(traces[0].read_text())["traceEvents"]}
    assert f"[pl][profile]{STEP}" in names
    assert any(name and name.startswith("[pl][module]torch.nn.modules.linear.Linear: net.0") for name in names)
    report = (tmp_path / "fit-perf.txt").read_text()
    assert "Profile stats for: records" in report and "aten::" in report  # the operator table


def test_pytorch_profiler_follows_a_given_schedule_over_training_steps(tmp_path):
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    profiler = PyTorchProfiler(dirpath=tmp_path, schedule=schedule, record_module_names=False)
    quiet_trainer(max_steps=6, profiler=profiler).fit(TinyModule(), loader(96))
    (trace,) = tmp_path.glob("fit-*training_step*.pt.trace.json")
    steps = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("name", "").startswith("Prof")}
    # numbered from 0: waited on the first training step, warmed up on the second, recorded the third and fourth
    assert steps == {"ProfilerStep#2", "ProfilerStep#3"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(sort_by_key="speed"), r"sort_by_key\)='speed' is not valid.*'cpu_time_total'"),
        (dict(schedule=3), r"schedule=3.*callable"),
        (dict(schedule=lambda step: 1), r"returned 1 for step 0.*ProfilerAction"),
        (dict(table_kwargs={"row_limit": 3}), r"'row_limit' is not an argument of EventList.table"),
    ],
)
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_pytorch_profiler_arguments_are_checked(kwargs, match):
    """A refused profiler says why, and its collection later raises nothing (its __del__ has nothing to undo)."""
    with pytest.raises(TandemConfigError, match=match):
        PyTorchProfiler(**kwargs)
    gc.collect()
