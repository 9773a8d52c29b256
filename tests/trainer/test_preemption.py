"""Pre-emption: SIGTERM / SIGUSR1 during fit stop every rank at one step, write an exact ``last.ckpt``, run
teardown and exit with 128 + the signal; under SLURM (SIGUSR1) rank 0 requeues the job; ``fit(ckpt_path="last")``
then ends with the weights of an uninterrupted run. Real processes: ``scripts/preempt_run.py``."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import tandem
from helpers import TinyModule, clear_launch_variables, launch_free_env, loader, quiet_trainer
from tandem.strategies.environments import SLURMEnvironment
from tandem.utilities.checkpoint import load_checkpoint_file
from tandem.utilities.exceptions import Preempted
from tandem.utilities.preemption import PREEMPTION

SCRIPT = Path(__file__).parent / "scripts" / "preempt_run.py"


def _run(mode: str, folder: Path, devices: int, timeout: float = 100, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), mode, str(folder), str(devices)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**launch_free_env(**env), "PYTHONUNBUFFERED": "1"},
        cwd=folder,
    )


def _record(folder: Path, name: str, rank: int) -> dict[str, Any]:
    return json.loads((folder / f"record-{name}-{rank}.json").read_text())


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


# ---------------------------------------------------------------------------------------------- one process
class _SignalAt(TinyModule):
    def __init__(self, at: tuple[int, int] | None = None) -> None:
        super().__init__(dropout=0.3)  # dropout: the RNG state must come back too
        self.at = at

    def training_step(self, batch, batch_idx):
        if (self.current_epoch, batch_idx) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


def _fit(root: Path, at: tuple[int, int] | None = None, ckpt_path: str | None = None) -> tuple[Any, Any]:
    tandem.seed_everything(3)
    model = _SignalAt(at)
    trainer = quiet_trainer(max_epochs=2, accumulate_grad_batches=2, default_root_dir=root)  # no ModelCheckpoint
    trainer.fit(model, loader(n=64, batch_size=8, shuffle=True), ckpt_path=ckpt_path)
    return trainer, model


def test_a_signal_in_process_stops_after_the_step_and_resumes_exactly(tmp_path):
    """In the calling process: SIGTERM during a micro-batch raises Preempted (exit code 143) once the
    accumulation's optimizer step is done, with last.ckpt where ckpt_path="last" looks and the previous handler
    back; fit(ckpt_path="last") then ends with the weights of an uninterrupted fit, bit for bit."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted) as caught:
        _fit(tmp_path / "run", at=(1, 2))
    assert caught.value.code == 128 + signal.SIGTERM
    assert "SIGTERM received: stopped at epoch 1, global step 6" in str(caught.value)
    assert signal.getsignal(signal.SIGTERM) is before and PREEMPTION.signum is None
    assert caught.value.checkpoint == str(tmp_path / "run" / "checkpoints" / "last.ckpt")
    loops = load_checkpoint_file(caught.value.checkpoint)["loops"]
    assert (loops["epoch"], loops["batches_done"]) == (1, 4)  # batch 2 was a micro-batch: batch 3 stepped first
    resumed, model = _fit(tmp_path / "run", ckpt_path="last")
    _, reference = _fit(tmp_path / "reference")
    assert resumed.global_step == 8 and not resumed.interrupted
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


class _StepLRSignalAt(_SignalAt):
    """A StepLR scheduler of the epoch; ``manual``: the module accumulates two batches per step itself and steps
    its scheduler in on_train_epoch_end (Lightning's recipe under manual optimization)."""

    def __init__(self, at: tuple[int, int] | None = None, manual: bool = False) -> None:
        super().__init__(at)
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        self.manual_backward(loss / 2)
        if (batch_idx + 1) % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()
        return None

    def on_train_epoch_end(self) -> None:
        if not self.automatic_optimization:
            self.lr_schedulers().step()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_stop_at_an_epochs_last_optimizer_step_resumes_without_torchs_scheduler_warning(tmp_path, manual):
    """SIGTERM in the epoch's last batch: the fit stops right after the epoch's last optimizer step, before its end,
    with accumulated gradients (two batches a step) and an epoch scheduler that never stepped yet (manual: the module
    steps it in on_train_epoch_end). The resumed run's first scheduler step then comes before its first optimizer
    step, as it should: torch must not warn "Detected call of `lr_scheduler.step()` before `optimizer.step()`"
    (every rank printed it), and the weights are those of an uninterrupted fit, bit for bit."""

    def fit(root: Path, at: tuple[int, int] | None = None, ckpt_path: str | None = None) -> torch.nn.Module:
        tandem.seed_everything(3)
        model = _StepLRSignalAt(at, manual)
        accumulate = 1 if manual else 2
        trainer = quiet_trainer(
            max_epochs=2, accumulate_grad_batches=accumulate, limit_val_batches=0, default_root_dir=root
        )
        trainer.fit(model, loader(n=64, batch_size=8, shuffle=True), ckpt_path=ckpt_path)
        return model

    with pytest.raises(Preempted) as caught:
        fit(tmp_path / "run", at=(0, 7))
    loops = load_checkpoint_file(caught.value.checkpoint)["loops"]
    assert (loops["epoch"], loops["batches_done"], loops["global_step"]) == (0, 8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed = fit(tmp_path / "run", ckpt_path="last")
    reference = fit(tmp_path / "reference")
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), reference.state_dict().values()))


def test_sigusr1_under_slurm_saves_last_and_requeues_the_job(tmp_path):
    """A process SIGUSR1'd mid-epoch (epoch 1, a micro-batch) exits 138 within seconds after writing last.ckpt,
    running on_exception and teardown, and calling `scontrol requeue <job>`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.txt"}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = _run("stop", tmp_path, 1, PREEMPT_AT="1:4:0:SIGUSR1", **slurm)
    ended = time.time()
    assert done.returncode == 128 + signal.SIGUSR1, done.stderr[-3000:]
    assert "[tandem] SIGUSR1 received: stopped at epoch 1, global step 11 and saved" in done.stderr
    assert "Requeued SLURM job 4242" in done.stderr
    assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "4242"]
    assert ended - float((tmp_path / "signal-0.txt").read_text()) < 10
    assert _record(tmp_path, "stop", 0) == {
        "exception": "Preempted",
        "epoch": 1,
        "batches_done": 6,  # the signal came in micro-batch 4; the stop is after batch 5's optimizer step
        "global_step": 11,
        "pid": _record(tmp_path, "stop", 0)["pid"],
    }
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


# ---------------------------------------------------------------------------------------------- two ranks
@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One DDP job pre-empted twice (rank 1 alone gets SIGTERM in the first fit, caught; rank 0 alone gets
    SIGUSR1 in the resumed second fit, uncaught), then one job resuming to the end beside a reference fit."""
    folder = tmp_path_factory.mktemp("preempt_ddp")
    done = _run("stop", folder, 2, PREEMPT_AT="0:2:1:SIGTERM,1:2:0:SIGUSR1")
    ended = time.time()
    resumed = _run("resume", folder, 2)
    return {"folder": folder, "stop": done, "ended": ended, "resume": resumed}


def test_ddp_one_signalled_rank_stops_every_rank_at_one_step(ddp_runs):
    """Rank 1 alone signalled (the store carries it to rank 0) and rank 0 alone signalled (forwarded, and the
    store): both ranks stop after the same optimizer step, run on_exception and teardown, and the job exits
    with 128 + SIGUSR1 within seconds, leaving no process behind."""
    folder, done = ddp_runs["folder"], ddp_runs["stop"]
    assert done.returncode == 128 + signal.SIGUSR1, done.stderr[-3000:]
    assert "RankFailedError" not in done.stderr and "Traceback" not in done.stderr
    assert "[tandem] SIGTERM received: stopped at epoch 0" in done.stderr
    assert "[tandem] SIGUSR1 received: stopped at epoch 1" in done.stderr
    for name, epoch, signalled in (("first", 0, 2), ("stop", 1, 2)):
        records = [_record(folder, name, r) for r in (0, 1)]
        assert records[0] | {"pid": 0} == records[1] | {"pid": 0}  # the same step on both ranks
        assert records[0]["exception"] == "Preempted" and records[0]["epoch"] == epoch
        assert records[0]["batches_done"] % 2 == 0  # after an optimizer step (accumulate_grad_batches=2)
        assert signalled < records[0]["batches_done"] <= signalled + 4  # within a step or two of the signal
    assert ddp_runs["ended"] - float((folder / "signal-0.txt").read_text()) < 15
    assert all(_gone(_record(folder, "stop", r)["pid"]) for r in (0, 1))


def test_ddp_resume_after_preemption_equals_an_uninterrupted_run(ddp_runs):
    resumed = ddp_runs["resume"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((ddp_runs["folder"] / "result.json").read_text()) == {"equal": True, "global_step": 12}


def test_a_signal_after_the_last_step_lets_the_fit_finish_and_stops_the_next_one(tmp_path):
    class SignalAtTheEnd(tandem.Callback):
        def on_train_epoch_end(self, trainer, module):
            if trainer.current_epoch == trainer.max_epochs - 1:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path, callbacks=[SignalAtTheEnd()])
    with pytest.warns(UserWarning, match="SIGTERM arrived after the last step of the fit"):
        trainer.fit(TinyModule(), loader())
    assert trainer.state.status == "finished" and PREEMPTION.signum == signal.SIGTERM
    with pytest.raises(Preempted, match="stopped at epoch 0, global step 1 "):
        quiet_trainer(max_epochs=1, default_root_dir=tmp_path).fit(TinyModule(), loader())
    assert PREEMPTION.signum is None


class _Rank1Signals(TinyModule):
    """ddp_spawn pickles the module: a class the spawned processes can import."""

    def training_step(self, batch, batch_idx):
        if (self.global_rank, batch_idx) == (1, 1):
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


def test_ddp_spawn_caller_gets_preempted_when_a_rank_is_signalled(tmp_path, monkeypatch):
    """Under ddp_spawn the caller raises Preempted (rank 0's message and checkpoint) instead of RankFailedError."""
    clear_launch_variables(monkeypatch)  # and restored after: the launcher exports MASTER_PORT
    before = signal.getsignal(signal.SIGTERM)
    trainer = quiet_trainer(
        strategy="ddp_spawn", devices=2, max_epochs=2, default_root_dir=tmp_path, enable_checkpointing=True
    )
    with pytest.raises(Preempted) as caught:
        trainer.fit(_Rank1Signals(), loader(n=64, batch_size=4))
    assert caught.value.code == 128 + signal.SIGTERM and "SIGTERM received: stopped at epoch 0" in str(caught.value)
    loops = load_checkpoint_file(caught.value.checkpoint)["loops"]
    assert loops["epoch"] == 0 and 2 <= loops["batches_done"] <= 4
    assert signal.getsignal(signal.SIGTERM) is before and PREEMPTION.forward_to is None and PREEMPTION.signum is None


def test_preempted_is_a_system_exit_with_the_signal_code():
    error = Preempted(signal.SIGTERM, "last.ckpt", "stopped")
    assert isinstance(error, SystemExit) and not isinstance(error, Exception)
    assert error.code == 143 and str(error) == "stopped" and error.checkpoint == "last.ckpt"


def test_a_trainer_in_another_thread_leaves_the_signal_handlers_alone(tmp_path):
    import threading

    before = signal.getsignal(signal.SIGTERM)
    seen = []

    class Peek(tandem.Callback):
        def on_train_start(self, trainer, module):
            seen.append(signal.getsignal(signal.SIGTERM))

    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path, callbacks=[Peek()])
    thread = threading.Thread(target=trainer.fit, args=(TinyModule(), loader()))
    thread.start()
    thread.join(60)
    assert seen == [before] and torch.is_tensor(trainer.callback_metrics.get("train_loss"))


class _SignalInEpoch1(tandem.Callback):
    def __init__(self, signum: int) -> None:
        self.signum = signum

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == (1, 0):
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize(
    ("plugins", "signum", "requeued"),
    [
        ([], signal.SIGUSR1, True),  # SLURM batch job, no plugin: requeue on SIGUSR1 (as before)
        ([SLURMEnvironment(auto_requeue=False)], signal.SIGUSR1, False),
        ([SLURMEnvironment(requeue_signal=signal.SIGTERM)], signal.SIGTERM, True),
        ([SLURMEnvironment(requeue_signal=signal.SIGTERM)], signal.SIGUSR1, False),
    ],
    ids=["default", "auto_requeue_off", "requeue_on_sigterm", "sigusr1_not_the_requeue_signal"],
)
def test_a_slurm_environment_plugin_decides_whether_the_stop_requeues(tmp_path, monkeypatch, plugins, signum, requeued):
    """Lightning's SLURMEnvironment(auto_requeue=False) turns the requeue off; requeue_signal picks the signal.
    The stop (last.ckpt, Preempted) happens either way."""
    clear_launch_variables(monkeypatch)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.txt"}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    trainer = quiet_trainer(
        max_epochs=3,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        plugins=plugins,
        callbacks=[_SignalInEpoch1(signum)],
    )
    with pytest.raises(Preempted) as caught:
        trainer.fit(TinyModule(), loader())
    assert caught.value.code == 128 + signum and Path(caught.value.checkpoint).is_file()
    if requeued:
        assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "4242"]
        assert "Requeued SLURM job 4242" in str(caught.value)
    else:
        assert not (tmp_path / "scontrol.txt").exists()
        assert 'Resume with trainer.fit(..., ckpt_path="last")' in str(caught.value)
