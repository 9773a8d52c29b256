"""Small modules, data and runners shared by the tests."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from filelock import FileLock
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem

REPO = Path(__file__).resolve().parents[1]


#: every variable a launcher (torchrun, srun, tandem's own) sets; process tests start without them
LAUNCH_VARIABLES = re.compile(
    r"^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK|MASTER_ADDR|MASTER_PORT|OMP_NUM_THREADS"
    r"|TANDEM_.*|PL_GLOBAL_SEED|PL_SEED_WORKERS|TORCHELASTIC_.*|SLURM_.*|OMPI_.*|PMI_.*|PMIX_.*|MPI_LOCAL.*|MV2_.*|HYDI_.*|JSM_NAMESPACE_.*|LSB_.*"
    r"|KUBERNETES_.*)$"
)


def launch_free_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's variables, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not LAUNCH_VARIABLES.match(k)}, **extra}


def clear_launch_variables(monkeypatch) -> None:
    """Remove every launcher variable from this process's environment for one test."""
    for name in [n for n in os.environ if LAUNCH_VARIABLES.match(n)]:
        monkeypatch.delenv(name)


def make_data(n: int = 64, features: int = 8, classes: int = 3, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return TensorDataset(x, y % classes)


def loader(n: int = 64, batch_size: int = 16, shuffle: bool = False, **kwargs) -> DataLoader:
    return DataLoader(make_data(n), batch_size=batch_size, shuffle=shuffle, **kwargs)


class TinyModule(tandem.TrainingModule):
    """A classifier that logs train/val/test losses; optimizer and scheduler configurable."""

    def __init__(self, lr: float = 0.1, optimizer: str = "sgd", dropout: float = 0.0, scheduler: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(dropout), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        if self.hparams.optimizer == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        if not self.hparams.scheduler:
            return opt
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


def quiet_trainer(**kwargs) -> tandem.Trainer:
    """A CPU trainer without logger, checkpoints, progress bar or summary unless asked (a ModelCheckpoint in
    ``callbacks`` asks for checkpoints)."""
    from tandem.callbacks import ModelCheckpoint

    callbacks = kwargs.get("callbacks") or []
    callbacks = [callbacks] if isinstance(callbacks, tandem.Callback) else callbacks
    defaults = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    defaults.update(kwargs)
    return tandem.Trainer(**defaults)


def float16_mixed(accelerator: str = "cpu") -> dict:
    """Trainer arguments for float16 autocast with loss scaling on ``accelerator``. On the CPU the Trainer's
    ``precision="16-mixed"`` becomes bf16-mixed (as in Lightning); a strategy built with it keeps float16."""
    if accelerator == "cpu":
        return dict(strategy=tandem.strategies.SingleDeviceStrategy("cpu", precision="16-mixed"))
    return dict(accelerator=accelerator, precision="16-mixed")


def shared_folder(tmp_path_factory, name: str, fill: Callable[[Path], None]) -> Path:
    """A folder that ``fill`` fills once per test run, even when pytest-xdist workers ask for it at the same time:
    the first worker fills it under a file lock in the run's shared temporary folder; the others wait and reuse it.
    (Without xdist it is a folder of this session.) A ``fill`` that raises leaves nothing behind: the next asker
    tries again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of one run
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            fill(folder)
            done.touch()
    return folder


def run_python(
    args: list[str], timeout: float = 120, cwd: str | Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a Python script in a fresh process with the repo's tandem importable; output captured."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env
    )


def killed_mid_save(root: Path, kind: str) -> Path:
    """Run ``trainer/scripts/killed_save.py`` (``kind``: "file", "sharded", "async", "swap") under ``root`` and
    SIGKILL it in the middle of its second checkpoint save; returns the checkpoints folder it was writing to."""
    env = {**launch_free_env(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    script = Path(__file__).parent / "trainer" / "scripts" / "killed_save.py"
    child = subprocess.Popen(
        [sys.executable, str(script), str(root), kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = child.stdout.readline().strip()
    finally:
        child.kill()
        _, err = child.communicate(timeout=30)
    assert line == "writing", err[-3000:]
    return root / "tandem_logs" / "version_0" / "checkpoints"


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def regression_data(n: int = 1024, seed: int = 0) -> TensorDataset:
    """A noisy linear target of 4 features: the learning-rate range test's problem."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


class Regression(tandem.TrainingModule):
    """A linear regression whose ``lr`` and ``batch_size`` are hyperparameters its hooks read (what the tuner
    sets). With ``fits_up_to``, a training batch larger than that raises an out-of-memory error (``oom``: "torch",
    a ``torch.OutOfMemoryError``; "message", a RuntimeError with CUDA's message), as a device of that size would."""

    def __init__(
        self, lr: float = 0.01, batch_size: int = 64, n: int = 1024, fits_up_to: int | None = None, oom="torch"
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(4, 1)
        self.tried: list[int] = []  # the batch sizes training_step saw, in order

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.tried.append(len(x))
        limit = self.hparams.fits_up_to
        if limit is not None and len(x) > limit:
            message = f"CUDA out of memory. Tried to allocate {len(x)} MiB (simulated: batches above {limit})"
            raise torch.OutOfMemoryError(message) if self.hparams.oom == "torch" else RuntimeError(message)
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(regression_data(self.hparams.n), batch_size=self.hparams.batch_size, shuffle=True)


class Payload:
    """An object whose unpickling writes the file ``marker`` (what a malicious checkpoint holds): a test that passes a
    file holding it asserts the marker is absent."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _same_number(want: float, got: float) -> bool:
    """The parity suites' tolerance: equal to Lightning's recorded value up to float rounding (NaN equals NaN)."""
    return (math.isnan(want) and math.isnan(got)) or math.isclose(want, got, rel_tol=1e-6, abs_tol=1e-7)


def lightning_differences(want: dict[str, float], got: dict[str, Any]) -> list[str]:
    """One line per key that differs from Lightning's recorded value, is missing or is extra, in Lightning's order."""
    lines = []
    for key in [*want, *(k for k in got if k not in want)]:
        if key not in got:
            lines.append(f"  {key}: lightning {want[key]!r}, tandem (missing)")
        elif key not in want:
            lines.append(f"  {key}: lightning (missing), tandem {got[key]!r}")
        elif not _same_number(want[key], got[key]):
            lines.append(f"  {key}: lightning {want[key]!r}, tandem {got[key]!r} (diff {got[key] - want[key]:+.3g})")
    return lines


def lightning_by_rank(constants: dict[str, float], devices: int) -> list[dict[str, float]]:
    """Lightning's recorded values for each rank: rank 1's own values are recorded as ``rank1/<key>``."""
    rank0 = {k: v for k, v in constants.items() if not k.startswith("rank1/")}
    rank1 = {k.removeprefix("rank1/"): v for k, v in constants.items() if k.startswith("rank1/")}
    return [rank0] if devices == 1 else [rank0, {**rank0, **rank1}]


class Nested(tandem.TrainingModule):
    """Nested submodules with an example input: the model summary's tests (Lightning's table recorded for it)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.1)))
        self.head = nn.Linear(16, 2)
        self.example_input_array = torch.zeros(4, 8)

    def forward(self, x):
        return self.head(self.encoder(x))

    def training_step(self, batch, batch_idx):
        return self(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
