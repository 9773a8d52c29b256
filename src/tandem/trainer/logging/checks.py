"""Where ``self.log`` may be called, and with what: the reductions it accepts, the hooks that may log and what
each may log, a logged torchmetrics Metric's home (Lightning's rules, its ``_FxValidator`` table included)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tandem.utilities.exceptions import LogCallError, bad_choice
from tandem.utilities.logged_values import is_metric

if TYPE_CHECKING:
    from tandem.trainer.logging.entry import _Entry

REDUCE_FX = ("mean", "sum", "max", "min")
#: the functions ``self.log(reduce_fx=...)`` accepts besides the names (Lightning's): torch's reductions, the builtins
_REDUCE_FUNCTIONS = {
    torch.mean: "mean",
    torch.sum: "sum",
    sum: "sum",
    torch.max: "max",
    max: "max",
    torch.min: "min",
    min: "min",
}


def reduce_fx_name(name: str, reduce_fx: Any) -> str:
    """``self.log(name, reduce_fx=...)`` as one of ``REDUCE_FX``, as Lightning reads it: a name in any case
    (``"avg"`` is ``"mean"``), or ``torch.mean``, ``torch.sum``, ``torch.max``, ``torch.min`` and the builtins
    ``sum``, ``max``, ``min``. Anything else is refused (a custom reduction is a torchmetrics Metric's job)."""
    if isinstance(reduce_fx, str):
        fx: str | None = reduce_fx.lower()
        fx = "mean" if fx == "avg" else fx
    else:
        try:
            fx = _REDUCE_FUNCTIONS.get(reduce_fx)
        except TypeError:  # unhashable: none of them
            fx = None
    if fx in REDUCE_FX:
        return fx
    raise bad_choice(
        f"self.log({name!r}, reduce_fx=...)",
        reduce_fx,
        REDUCE_FX,
        fix="Names are read in any case ('avg' is 'mean'); torch.mean, torch.sum, torch.max, torch.min and the "
        "builtins sum, max and min are accepted too. For a custom reduction, log a torchmetrics.Metric instead.",
        lead="Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported.",
    )


# ---------------------------------------------------------------------- where self.log may be called
#: hooks whose ``self.log`` values would go nowhere (Lightning's ``_FxValidator`` refuses them too): before
#: the first stage starts or after its values were published, in prediction (which publishes nothing), and
#: around checkpoints and exceptions
NO_LOGGING_HOOKS = frozenset(
    {
        "on_fit_start",
        "on_fit_end",
        "on_sanity_check_start",
        "on_sanity_check_end",
        "on_train_end",
        "on_validation_end",
        "on_test_end",
        "on_predict_start",
        "on_predict_end",
        "on_predict_epoch_start",
        "on_predict_epoch_end",
        "on_predict_batch_start",
        "on_predict_batch_end",
        "predict_step",
        "on_save_checkpoint",
        "on_load_checkpoint",
        "on_exception",
    }
)
#: hooks that run once per stage or epoch: they log epoch values only (``on_step=True`` has no step to belong to)
EPOCH_ONLY_HOOKS = frozenset(
    {
        "on_train_start",
        "on_validation_start",
        "on_test_start",
        "on_train_epoch_start",
        "on_train_epoch_end",
        "on_validation_epoch_start",
        "on_validation_epoch_end",
        "on_test_epoch_start",
        "on_test_epoch_end",
    }
)
_SUFFIX = "/dataloader_idx_"


def check_log_call(
    name: str,
    hook: str | None,
    on_step: bool,
    on_epoch: bool,
    add_dataloader_idx: bool,
    loader: int | None,
    entry: _Entry | None,
    stage: str | None,
) -> None:
    """Refuse a ``self.log`` call whose value would be lost or mixed up (Lightning's rules, its ``_FxValidator``
    table included). Called for a name's first value in a stage's epoch, and again when the hook or (with
    ``add_dataloader_idx=False``) the evaluation loader changes."""
    shown = name.rsplit(_SUFFIX, 1)[0] if add_dataloader_idx and loader is not None else name  # as the user wrote it
    if hook is None or hook in NO_LOGGING_HOOKS:
        where = (
            f"inside {hook}"
            if hook is not None
            else "outside the hooks the Trainer runs (e.g. in setup, teardown, configure_model, configure_optimizers, "
            "prepare_data, lr_scheduler_step, a dataloader or batch-transfer hook, or after the run)"
        )
        why = (
            "prediction publishes no logged values"
            if stage == "predict" or (hook or "").startswith(("on_predict", "predict"))
            else "the value would never reach callback_metrics or the loggers"
        )
        raise LogCallError(
            f"self.log({shown!r}, ...) was called {where}, where logging is not supported: {why}. Log from the "
            "training / validation / test steps or their batch and epoch hooks, or write to the logger directly "
            "(self.logger.log_metrics({...}, step=...) or self.logger.experiment)."
        )
    if hook in EPOCH_ONLY_HOOKS and (on_step or not on_epoch):
        raise LogCallError(
            f"self.log({shown!r}, ..., on_step={on_step}, on_epoch={on_epoch}) inside {hook}: this hook runs once, not "
            "per step, so it logs epoch values only. Leave on_step and on_epoch at their defaults there (or pass "
            "on_step=False, on_epoch=True), or log per-step values from training_step or on_train_batch_end."
        )
    if not on_step and not on_epoch:
        raise LogCallError(
            f"`self.log({shown}, ..., on_step=False, on_epoch=False)` in {hook} is not useful: the value would be "
            "published neither per step nor per epoch. Drop one of them (or both, for the hook's defaults)."
        )
    user_suffixes = shown.count(_SUFFIX)
    if user_suffixes:
        raise LogCallError(
            f"You called `self.log` with the key `{shown}`, but the name holds {_SUFFIX!r}, which tandem adds itself when there are several "
            f"evaluation loaders (and splits results by). Log the plain name ({shown.split(_SUFFIX)[0]!r}), or with "
            "add_dataloader_idx=False a name of your own without that part."
        )
    if entry is not None and not add_dataloader_idx and loader is not None and entry.loader not in (None, loader):
        raise LogCallError(
            f"self.log({name!r}, ..., add_dataloader_idx=False) in {hook} for dataloader {loader}, but {name!r} was "
            f"already logged from dataloader {entry.loader} in this {_STAGE_WORDS.get(stage or '', stage)} run: the loaders' "
            "values would be averaged into one number, reported for each. Give each loader its own name (e.g. "
            f'f"{name}_{{dataloader_idx}}"), or drop add_dataloader_idx=False (tandem then names them '
            f"'{name}/dataloader_idx_N')."
        )


def check_metric_attribute(name: str, metric: Any, module: Any) -> None:
    """Refuse a logged torchmetrics Metric that is not a submodule of ``module`` (Lightning's rule): the module
    moves it to the device, saves its state in checkpoints and restores it; a Metric created in the step, or kept
    in a plain list or dict, has none of that."""
    if module is None or not isinstance(module, torch.nn.Module):
        return
    found = {id(m): attribute for attribute, m in module.named_modules() if is_metric(m)}
    if id(metric) in found:
        return
    if not found:
        raise LogCallError(
            "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. You can fix this "
            f"by setting an attribute for the metric in your `LightningModule`: self.log({name!r}, metric) got a "
            "Metric that is not a submodule of the module (created in the step, or kept in a plain list or dict), "
            "which the module neither moves to its device nor saves in checkpoints. Create it in __init__ as an "
            "attribute (self.acc = Accuracy(...)), or in an nn.ModuleList / nn.ModuleDict."
        )
    raise LogCallError(
        "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. You can fix this by "
        f"calling `self.log({name}, ..., metric_attribute=name)` where `name` is one of {list(found.values())}: "
        f"self.log({name!r}, metric) got a Metric that is not one of the module's own. Log the module's Metric "
        "attribute itself, or name it with metric_attribute."
    )


_STAGE_WORDS = {"sanity_check": "sanity-check validation", "validate": "validation"}
