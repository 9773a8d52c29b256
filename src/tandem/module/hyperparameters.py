"""``save_hyperparameters`` and ``hparams`` (shared by TrainingModule and DataModule): the arguments of the user's
``__init__``, read from its frames as Lightning does."""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from tandem.utilities.rank_zero import rank_zero_warn


class AttributeDict(dict):
    """A dict whose keys read as attributes: ``self.hparams.lr``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"hparams has no {key!r}; saved: {sorted(self)}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


class HyperparametersMixin:
    """``save_hyperparameters`` and ``hparams``, shared by [`TrainingModule`][tandem.TrainingModule] and
    [`DataModule`][tandem.DataModule]."""

    def save_hyperparameters(self, *names: Any, ignore: Iterable[str] | str | None = None, logger: bool = True) -> None:
        """Store the ``__init__`` arguments of the caller in ``self.hparams`` (and in checkpoints and loggers).

        Args:
            names: only these arguments (all by default); a single dict or Namespace is taken as is.
            ignore: arguments to leave out (e.g. modules passed in).
            logger: also send them to the loggers (False: checkpoints only).
        """
        self._log_hyperparams = logger
        if len(names) == 1 and not isinstance(names[0], str):
            given = names[0]
            self._hparams = AttributeDict(vars(given) if not isinstance(given, Mapping) else given)
            self._hparams_initial = copy.deepcopy(self._hparams)
            return
        init_args = _collect_init_args(sys._getframe(1), type(self))  # the caller's frame (not this one's: a cycle)
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        if names:
            init_args = {k: v for k, v in init_args.items() if k in names}
        init_args = {k: v for k, v in init_args.items() if k not in ignored}
        for name, value in init_args.items():
            if isinstance(value, nn.Module):
                rank_zero_warn(
                    f"save_hyperparameters(): the argument {name!r} is an nn.Module ({type(value).__name__}); its "
                    "weights are saved with the module's state_dict in every checkpoint already, and as a "
                    "hyperparameter it would be sent to the loggers and is left out of checkpoints (they hold plain data only). "
                    f"Leave it out: self.save_hyperparameters(ignore=[{name!r}]) (load_from_checkpoint then needs "
                    f"it passed again: load_from_checkpoint(path, {name}=...))."
                )
        self._hparams = AttributeDict(init_args)
        self._hparams_initial = copy.deepcopy(self._hparams)

    @property
    def hparams(self) -> AttributeDict:
        if "_hparams" not in self.__dict__:  # a subclass that did not call super().__init__()
            self.__dict__["_hparams"] = AttributeDict()
        return self.__dict__["_hparams"]

    @property
    def hparams_initial(self) -> AttributeDict:
        """The hyperparameters as ``save_hyperparameters`` stored them (a copy: later changes to ``hparams`` are
        not in it), as Lightning's."""
        return copy.deepcopy(self.__dict__.get("_hparams_initial", AttributeDict()))


def _collect_init_args(frame: Any, cls: type) -> dict[str, Any]:
    """The arguments of the ``__init__`` calls on the stack for this object; the innermost call wins."""
    collected: list[dict[str, Any]] = []
    while frame is not None:
        code = frame.f_code
        # f_locals only of __init__ frames: reading it snapshots the frame's variables into a dict the frame
        # keeps (Python < 3.13), so the caller's frame would go on holding its objects, a Trainer included.
        local_vars = frame.f_locals if code.co_name == "__init__" else {}
        if isinstance(local_vars.get("self"), cls):
            count = code.co_argcount + code.co_kwonlyargcount
            names = code.co_varnames[:count]
            args = {name: local_vars[name] for name in names[1:] if name in local_vars}
            if code.co_flags & inspect.CO_VARKEYWORDS:
                varkw = code.co_varnames[count + bool(code.co_flags & inspect.CO_VARARGS)]
                args.update(local_vars.get(varkw, {}))
            collected.append(args)
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for args in reversed(collected):
        merged.update(args)
    return merged
