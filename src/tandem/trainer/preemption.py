"""Stopping a fit for a pre-emption signal (SIGTERM, SIGUSR1): where, what is saved, and how the job ends.

The fit loop looks at each stop point (after a training batch with no gradients pending, and after each
epoch's end) only when ``PREEMPTION`` holds a signal. The ranks agree on
the position through the side channel's pre-emption vote
(``preemption_vote``), then ``stop`` writes an exact ``last.ckpt``,
asks SLURM to requeue the job (rank 0, on SIGUSR1; see
[`SLURMEnvironment`][tandem.strategies.environments.SLURMEnvironment] for turning that off) and raises
[`Preempted`][tandem.utilities.exceptions.Preempted].
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn

from tandem.strategies.environments import requeues, slurm_job_to_requeue
from tandem.strategies.side_channel import preemption_vote
from tandem.trainer import checkpointing
from tandem.utilities.exceptions import Preempted
from tandem.utilities.preemption import PREEMPTION, Progress
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer


@contextlib.contextmanager
def catching_signals(progress: Callable[[], Progress]) -> Iterator[None]:
    """Around the fit loop: SIGTERM / SIGUSR1 only set the flag the loop reads; before and after the fit
    they keep their previous handlers. ``progress`` says where the loop is (the side channel reads it)."""
    preemption_vote().new_round()
    PREEMPTION.install()
    PREEMPTION.progress = progress
    try:
        yield
        warn_if_pending()
    finally:
        PREEMPTION.progress = None
        PREEMPTION.uninstall()


def stop(trainer: Trainer) -> NoReturn:
    """Write ``last.ckpt`` (every rank builds it, rank 0 writes), requeue under SLURM, raise Preempted."""
    signum = PREEMPTION.signum or signal.SIGTERM
    path = checkpointing.last_checkpoint_path(trainer)
    trainer.save_checkpoint(path)  # the loop state says exactly where to continue
    if trainer.strategy.checkpoint_io is not None:
        trainer.strategy.checkpoint_io.wait()  # written in the background: on the disk before the job ends
    PREEMPTION.done()
    preemption_vote().new_round()
    name = signal.Signals(signum).name
    where = f"epoch {trainer.current_epoch}, global step {trainer.global_step}"
    message = f"[tandem] {name} received: stopped at {where} and saved {path}."
    if trainer.is_global_zero:
        job = slurm_job_to_requeue() if requeues(signum, trainer.strategy.cluster_environment) else None
        if job is not None:
            message += " " + _requeue(job)
        else:
            message += ' Resume with trainer.fit(..., ckpt_path="last").'
        print(message, file=sys.stderr, flush=True)
    raise Preempted(signum, path, message)


def warn_if_pending() -> None:
    """A signal came after the fit's last stop point: the fit ended normally. It stays pending, so a next
    fit in this process stops at its first step."""
    if PREEMPTION.signum is not None:
        rank_zero_warn(
            f"{signal.Signals(PREEMPTION.signum).name} arrived after the last step of the fit, which finished "
            "normally; a next fit in this process stops after its first step and saves last.ckpt."
        )


def _requeue(job: str) -> str:
    """``scontrol requeue <job>``, as Lightning does: SLURM starts the job again once it can."""
    if shutil.which("scontrol") is None:
        rank_zero_warn(f"SLURM job {job} could not be requeued: scontrol is not on PATH.")
        return "scontrol was not found, so the job was not requeued."
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        rank_zero_warn(f"`scontrol requeue {job}` failed ({result.returncode}): {result.stderr.strip()}")
        return f"`scontrol requeue {job}` failed, so the job was not requeued."
    return f'Requeued SLURM job {job}; it resumes if it calls trainer.fit(..., ckpt_path="last").'
