"""The Trainer's arguments, validated eagerly with no side effects (no processes, files or devices)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tandem.strategies.precision import Precision
from tandem.strategies.strategy import CLIP_ALGORITHMS
from tandem.utilities.exceptions import TandemConfigError, bad_choice, out_of_range


def _check_limit(name: str, value: int | float) -> int | float:
    """``limit_*_batches``, ``overfit_batches``, a batch-count ``val_check_interval``: an int count >= 0 or a fraction
    in [0, 1]; a whole float above 1 (``1e3``) counts batches, as in Lightning."""
    invalid = isinstance(value, bool) or not isinstance(value, (int, float))
    if invalid or math.isnan(value) or value < 0 or value > 1 and value % 1.0:
        raise TandemConfigError(
            f"You have passed invalid value {value} for {name}, it has to be in [0.0, 1.0] or an int. "
            f"{name}={value!r} is out of range; expected an int >= 0 (batches), a float in [0.0, 1.0] (fraction of "
            "the data) or a whole float above 1.0."
        )
    return int(value) if isinstance(value, float) and value > 1.0 else value


def _check_val_check_interval(value: Any, check_val_every_n_epoch: int | None) -> int | float:
    """A batch-count or fraction ``val_check_interval`` (a duration is parsed by ``time_interval_seconds``)."""
    value = _check_limit("val_check_interval", value)
    if value == 0:
        raise out_of_range(
            "val_check_interval", value, "an int >= 1 (batches) or a float in (0.0, 1.0] (fraction of an epoch)"
        )
    if check_val_every_n_epoch is None and isinstance(value, float):
        raise TandemConfigError(
            "`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
            "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`. With "
            f"check_val_every_n_epoch=None validation is not tied to epochs, so a fraction of one "
            f"(val_check_interval={value!r}) means nothing: pass a number of training batches, a duration, or "
            "check_val_every_n_epoch=1."
        )
    return value


def time_interval_seconds(value: str | timedelta | Mapping[str, Any]) -> float:
    """A time-based ``val_check_interval`` in seconds: ``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of its
    arguments (``{"minutes": 30}``), as Lightning reads it."""
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) != 4:
            raise TandemConfigError(
                f"Invalid time format for `val_check_interval`: {value!r}. Expected 'DD:HH:MM:SS'. For example "
                "'00:00:30:00' validates every 30 minutes."
            )
        try:
            days, hours, minutes, secs = (int(part) for part in parts)
        except ValueError:
            raise TandemConfigError(
                f"Non-integer component in `val_check_interval` string: {value!r}. Use 'DD:HH:MM:SS'. Each part is "
                "an integer: days, hours, minutes, seconds (e.g. '00:00:30:00')."
            ) from None
        duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=secs)
    elif isinstance(value, Mapping):
        try:
            duration = timedelta(**value)
        except TypeError as err:
            raise TandemConfigError(
                f"val_check_interval={dict(value)!r} is not a duration ({err}); a dict holds datetime.timedelta's "
                "arguments, e.g. {'minutes': 30}."
            ) from None
    else:
        duration = value
    seconds = duration.total_seconds()
    if seconds <= 0:
        raise out_of_range("val_check_interval", duration, "a duration longer than 0 seconds")
    return seconds


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise out_of_range(name, value, expected)
    return value


#: what the replica check does when DDP's replicas differ (see tandem.trainer.replicas)
DIVERGENCE_REACTIONS = ("raise", "warn")


@dataclass
class TrainerConfig:
    """Loop settings; see [`Trainer`][tandem.Trainer] for their meaning."""

    max_epochs: int | None = None
    max_steps: int = -1
    min_epochs: int | None = None
    min_steps: int | None = None
    limit_train_batches: int | float | None = 1.0
    limit_val_batches: int | float | None = 1.0
    limit_test_batches: int | float | None = 1.0
    limit_predict_batches: int | float | None = 1.0
    # a number of batches, a fraction of an epoch, or a duration ("DD:HH:MM:SS", a timedelta or its arguments' dict)
    val_check_interval: int | float | str | timedelta | dict[str, Any] | None = 1.0
    check_val_every_n_epoch: int | None = 1
    num_sanity_val_steps: int = 2
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None  # None: "norm"
    log_every_n_steps: int = 50
    fast_dev_run: bool | int = False
    precision: str | int = "32-true"
    max_time: Any = None  # the Timer's duration (the Trainer adds the Timer); here it only decides max_epochs=None
    overfit_batches: int | float = 0.0
    reload_dataloaders_every_n_epochs: int = 0
    on_replica_divergence: str = "raise"  # DDP replicas found different: "raise" or "warn" (train on, rank 0's saved)
    #: a time-based val_check_interval in seconds (validation when that much time passed since the last); else None
    val_check_time: float | None = None

    @property
    def sanity_steps(self) -> int | float:
        """Validation batches per loader the sanity check runs (``math.inf`` for -1: all)."""
        return math.inf if self.num_sanity_val_steps == -1 else self.num_sanity_val_steps

    def __post_init__(self) -> None:
        if self.max_steps is None:
            self.max_steps = -1
        _check_int("max_epochs", self.max_epochs, -1, allow_none=True)
        _check_int("max_steps", self.max_steps, -1)
        _check_int("min_epochs", self.min_epochs, 0, allow_none=True)
        _check_int("min_steps", self.min_steps, 0, allow_none=True)
        for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
            if getattr(self, name) is None:  # Lightning's default: all the batches
                setattr(self, name, 1.0)
            setattr(self, name, _check_limit(name, getattr(self, name)))
        every = self.check_val_every_n_epoch
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)):
            raise TandemConfigError(
                f"`check_val_every_n_epoch` should be an integer, found {every!r}. Pass an int >= 1 (validate every "
                "n epochs), or None to validate by val_check_interval alone."
            )
        _check_int("check_val_every_n_epoch", every, 1, allow_none=True)
        if self.val_check_interval is None:  # Lightning's default: once an epoch
            self.val_check_interval = 1.0
        if isinstance(self.val_check_interval, (str, timedelta, Mapping)):
            self.val_check_time = time_interval_seconds(self.val_check_interval)
        else:
            self.val_check_interval = _check_val_check_interval(self.val_check_interval, every)
        _check_int("num_sanity_val_steps", self.num_sanity_val_steps, -1)
        _check_int("accumulate_grad_batches", self.accumulate_grad_batches, 1)
        _check_int("log_every_n_steps", self.log_every_n_steps, 0)
        reload = self.reload_dataloaders_every_n_epochs
        if isinstance(reload, bool) or not isinstance(reload, int) or reload < 0:
            raise TandemConfigError(
                f"`reload_dataloaders_every_n_epochs` should be an int >= 0, got {reload}. "
                f"{out_of_range('reload_dataloaders_every_n_epochs', reload, 'an int >= 0 (0: build them once)')}"
            )
        self.overfit_batches = _check_limit("overfit_batches", self.overfit_batches)
        if self.on_replica_divergence not in DIVERGENCE_REACTIONS:
            raise bad_choice("on_replica_divergence", self.on_replica_divergence, DIVERGENCE_REACTIONS)
        if self.gradient_clip_algorithm is not None and self.gradient_clip_algorithm not in CLIP_ALGORITHMS:
            raise bad_choice("gradient_clip_algorithm", self.gradient_clip_algorithm, CLIP_ALGORITHMS)
        clip = self.gradient_clip_val
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
            raise out_of_range("gradient_clip_val", clip, "a number >= 0, or None for no clipping")
        if clip == 0:
            self.gradient_clip_val = None
        fdr = self.fast_dev_run
        if not isinstance(fdr, bool):  # a bool is kept as given (Lightning's)
            if isinstance(fdr, int) and fdr < 0:
                raise TandemConfigError(
                    f"fast_dev_run={fdr!r} is not a valid configuration. It should be >= 0. Pass True (or 1) to run "
                    "one batch of each stage, n for n batches, or False."
                )
            _check_int("fast_dev_run", fdr, 0)
        if fdr == 1:  # as Lightning keeps it: the value given, with 1 read as True
            self.fast_dev_run = True
        if fdr:
            n = int(fdr)
            self.max_epochs, self.max_steps, self.num_sanity_val_steps = 1, n, 0
            self.limit_train_batches = self.limit_val_batches = n
            self.limit_test_batches = self.limit_predict_batches = n
            self.val_check_interval, self.val_check_time = 1.0, None
        if self.overfit_batches > 0:  # as Lightning: the same batches (in order) for training and validation
            self.limit_train_batches = self.limit_val_batches = self.overfit_batches
        Precision(self.precision)  # raises a clear error for an unknown name
        if self.max_epochs is None:  # Lightning's default; max_epochs=-1 trains until something stops it
            self.max_epochs = 1000 if self.max_steps == -1 and self.max_time is None else -1

    @property
    def epoch_limit(self) -> int | float:
        assert self.max_epochs is not None  # __post_init__ resolved None
        return math.inf if self.max_epochs == -1 else self.max_epochs


def limit_batches(name: str, limit: int | float, available: int | float) -> int | float:
    """How many batches a ``limit_*_batches`` value allows out of ``available`` (inf for unsized loaders)."""
    if isinstance(limit, int):
        return min(limit, available)
    if limit == 1.0 or limit == 0.0:
        return available if limit == 1.0 else 0
    if available == math.inf:
        prefix = name[len("limit_") : -len("_batches")]
        raise TandemConfigError(
            f"When using an `IterableDataset`, `Trainer({name})` must be `1.0` or an int. An int specifies "
            f"`num_{prefix}_batches` to use. The loader has no length, so {name}={limit!r} (a fraction of it) cannot "
            f"be counted: pass {name}=<number of batches> instead."
        )
    return max(1, int(available * limit))


#: Lightning's notes on a batch setting of 1 (one batch) and of 1.0 (all of them), by setting; the others' in "*"
_ONE = {
    "limit_train_batches": "1 batch per epoch will be used.",
    "val_check_interval": "validation will run after every batch.",
    "*": "1 batch will be used.",
}
_ALL = {
    "limit_train_batches": "100% of the batches per epoch will be used.",
    "val_check_interval": "validation will run at the end of the training epoch.",
    "*": "100% of the batches will be used.",
}


def _limit_note(name: str, value: Any) -> str | None:
    """Lightning's note on a batch setting of exactly 1 or 1.0 (an int or a float: which one matters), else None."""
    if type(value) is int and value == 1:
        return f"`Trainer({name}=1)` was configured so {_ONE.get(name, _ONE['*'])}"
    if type(value) is float and value == 1.0:
        return f"`Trainer({name}=1.0)` was configured so {_ALL.get(name, _ALL['*'])}"
    return None


def limit_notes(given: dict[str, Any], fast_dev_run: bool | int) -> list[str]:
    """What Lightning's Trainer says (``rank_zero_info``) about the batch settings the user passed (``given``: name
    -> the value passed, None when left out) that are exactly 1 or 1.0, where an int and a float mean different
    things. Under ``fast_dev_run`` only ``overfit_batches`` is read; under ``overfit_batches`` not the training and
    validation limits (Lightning's order and rules). Call it once the values are validated."""
    overfit = given.get("overfit_batches") or 0
    names = ["overfit_batches"]
    if not fast_dev_run:
        names += ["limit_train_batches", "limit_val_batches"] if not overfit > 0 else []
        names += ["limit_test_batches", "limit_predict_batches", "val_check_interval"]
    return [note for note in (_limit_note(name, given.get(name)) for name in names) if note is not None]


#: Trainer arguments of Lightning 1.x (removed in Lightning 2) and what to write instead
LIGHTNING_1X_ARGUMENTS = {
    "gpus": "accelerator='gpu', devices=N",
    "tpu_cores": "accelerator='cpu' or 'gpu' (tandem runs on CPUs and CUDA devices)",
    "ipus": "accelerator='cpu' or 'gpu' (tandem runs on CPUs and CUDA devices)",
    "num_processes": "accelerator='cpu', devices=N, strategy='ddp'",
    "auto_select_gpus": "devices=N (CUDA_VISIBLE_DEVICES chooses which)",
    "distributed_backend": "strategy='ddp' (or 'ddp_spawn', 'dp')",
    "accelerator_backend": "strategy='ddp' (or 'ddp_spawn', 'dp')",
    "progress_bar_refresh_rate": "callbacks=[TQDMProgressBar(refresh_rate=N)], or enable_progress_bar=False",
    "process_position": "callbacks=[TQDMProgressBar(process_position=N)]",
    "resume_from_checkpoint": "trainer.fit(model, ..., ckpt_path=path)",
    "checkpoint_callback": "enable_checkpointing=True/False",
    "weights_summary": "enable_model_summary=True/False (or callbacks=[ModelSummary(max_depth=...)])",
    "weights_save_path": "default_root_dir=... (or ModelCheckpoint(dirpath=...))",
    "flush_logs_every_n_steps": "the logger's own flush setting (e.g. TensorBoardLogger(flush_secs=...))",
    "log_gpu_memory": "a callback that logs torch.cuda.memory_allocated() with trainer.log_metrics",
    "replace_sampler_ddp": "use_distributed_sampler=True/False",
    "amp_backend": "precision='16-mixed' or 'bf16-mixed'",
    "amp_level": "precision='16-mixed' or 'bf16-mixed'",
    "stochastic_weight_avg": "callbacks=[StochasticWeightAveraging(swa_lrs=...)]",
    "auto_lr_find": "tandem.tuner.Tuner(trainer).lr_find(model) (or callbacks=[LearningRateFinder()])",
    "auto_scale_batch_size": "tandem.tuner.Tuner(trainer).scale_batch_size(model) (or callbacks=[BatchSizeFinder()])",
    "track_grad_norm": "on_before_optimizer_step(self, optimizer): self.log('grad_norm', ...)",
    "terminate_on_nan": "on_nonfinite='raise' (the default; checked at logging steps, epoch ends and saves)",
    "prepare_data_per_node": "prepare_data_per_node = False as an attribute of your DataModule / TrainingModule",
    "move_metrics_to_cpu": "nothing: tandem keeps logged values on their device until a logger needs them",
    "multiple_trainloader_mode": "one training loader (combine datasets with torch.utils.data.ConcatDataset)",
    "reload_dataloaders_every_epoch": "loaders that change themselves each epoch (tandem builds them once per run)",
    "truncated_bptt_steps": "manual optimization (self.automatic_optimization = False) over the sequence chunks",
}

#: Lightning 2 Trainer arguments that tandem does not implement, and what to do instead
UNSUPPORTED_ARGUMENTS = {
    "model_registry": "ModelCheckpoint(dirpath=...) and your registry's own client",
}

#: the Trainer's opt-out arguments when not given (None), and under ``barebones=True`` (Lightning's)
OPT_OUT_DEFAULTS = dict(
    logger=True,
    enable_checkpointing=True,
    enable_progress_bar=True,
    enable_model_summary=True,
    log_every_n_steps=50,
    num_sanity_val_steps=2,
)
BAREBONES = dict(
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    log_every_n_steps=0,
    num_sanity_val_steps=0,
)


def check_barebones(chosen: dict[str, Any]) -> None:
    """``barebones=True`` with a feature it turns off asked for explicitly: an error naming it (as Lightning)."""
    off = {**BAREBONES, "fast_dev_run": False, "detect_anomaly": False, "profiler": None}
    for name, value in chosen.items():
        if value is not None and value != off[name] and not (name == "fast_dev_run" and value == 0):
            raise TandemConfigError(
                f"Trainer(barebones=True, {name}={value!r}): barebones mode turns {name} off to measure tandem's "
                f"own overhead. Remove {name}=..., or drop barebones=True to use it."
            )


def check_unknown_arguments(arguments: dict[str, Any], known: list[str]) -> None:
    """Trainer arguments it does not take: a Lightning 1.x spelling, a Lightning 2 feature tandem lacks, or a
    typo. Each gets an error naming what to write instead."""
    import difflib

    for name, value in arguments.items():
        if name in LIGHTNING_1X_ARGUMENTS:
            raise TandemConfigError(
                f"Trainer({name}={value!r}) is a Lightning 1.x argument (removed in Lightning 2). Write "
                f"{LIGHTNING_1X_ARGUMENTS[name]} instead."
            )
        if name in UNSUPPORTED_ARGUMENTS:
            raise TandemConfigError(
                f"Trainer({name}=...) is not supported by tandem. Instead: {UNSUPPORTED_ARGUMENTS[name]}."
            )
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]}=?" if close else ""
        raise TandemConfigError(f"Trainer got an unknown argument {name}={value!r}.{hint}")
