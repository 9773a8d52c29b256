"""The checks of ModelCheckpoint's arguments, made when it is built: a mistake is reported before any training, with
Lightning's sentence first, then what was expected and the fix."""

from datetime import timedelta

from tandem.utilities.exceptions import bad_choice, incompatible, out_of_range

_MODES = ("min", "max")
_MODE_FIX = "Use 'min' for losses, 'max' for accuracies."
_SAVE_LAST = (None, False, True, "link")
_SAVE_LAST_FIX = "Use True for a copy named last.ckpt, 'link' for a symbolic link to the latest checkpoint."


def check_arguments(
    mode: str,
    save_last: object,
    save_top_k: int,
    every_n_train_steps: int | None,
    every_n_epochs: int | None,
    train_time_interval: timedelta | None,
    monitor: str | None,
) -> None:
    """Raise the error a mistaken combination of ModelCheckpoint's arguments gets (see its docstring)."""
    if mode not in _MODES:
        lead = f"`mode` can be {', '.join(_MODES)} but got {mode}."  # Lightning's sentence first, then ours
        raise bad_choice("ModelCheckpoint: mode", mode, _MODES, _MODE_FIX, lead=lead)
    if save_last not in _SAVE_LAST:  # a typo ("lnk") or a string from a config would write a copy
        raise bad_choice("ModelCheckpoint: save_last", save_last, _SAVE_LAST, _SAVE_LAST_FIX)
    if not isinstance(save_top_k, int) or save_top_k < -1:
        lead = f"Invalid value for save_top_k={save_top_k}. Must be >= -1."
        raise out_of_range("ModelCheckpoint: save_top_k", save_top_k, "an int >= -1 (-1 keeps all)", lead=lead)
    for arg, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
        if value is not None and (not isinstance(value, int) or value < 0):
            lead = f"Invalid value for {arg}={value}. Must be >= 0."
            raise out_of_range(f"ModelCheckpoint: {arg}", value, "None or an int >= 0", lead=lead)
    if train_time_interval is not None and (
        not isinstance(train_time_interval, timedelta) or train_time_interval.total_seconds() <= 0
    ):
        raise out_of_range("ModelCheckpoint: train_time_interval", train_time_interval, "a positive datetime.timedelta")
    triggers = {
        "every_n_train_steps": (every_n_train_steps or 0) > 0,
        "every_n_epochs": (every_n_epochs or 0) > 0,
        "train_time_interval": train_time_interval is not None,
    }
    if sum(triggers.values()) > 1:
        given = ", ".join(name for name, on in triggers.items() if on)
        raise incompatible(
            f"ModelCheckpoint({given})",
            "a checkpoint is saved by steps, by time or by epochs, one of them",
            "Pass only one of them (use several ModelCheckpoint callbacks for several schedules).",
            lead=f"Combination of parameters every_n_train_steps={every_n_train_steps or 0}, every_n_epochs="
            f"{every_n_epochs or 0} and train_time_interval={train_time_interval} should be mutually exclusive.",
        )
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise incompatible(
            f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None)",
            "the top k are ranked by the monitored metric, and there is none",
            "Set monitor= to the logged metric that ranks them (e.g. monitor='val_loss'), or save_top_k=-1 to "
            "keep every checkpoint, 1 to keep the latest.",
            lead=f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration. "
            "No quantity for top_k to track.",
        )
