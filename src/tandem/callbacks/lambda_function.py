"""LambdaCallback: a callback made of plain functions, one keyword argument per hook."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import TandemConfigError

#: every hook a LambdaCallback can take: the Callback hooks (``setup``, ``teardown`` and the ``on_*`` ones)
HOOKS = tuple(sorted(n for n in vars(Callback) if n in ("setup", "teardown") or n.startswith("on_")))


class LambdaCallback(Callback):
    """A callback whose hooks are the functions given, by hook name; each is called as the hook would be,
    ``fn(trainer, module, ...)``. Every hook of [`Callback`][tandem.Callback] can be given (``setup``, ``teardown``,
    ``on_fit_start``, ``on_train_batch_end``, ``on_save_checkpoint``, ``on_exception``, ...); the others are
    not called at all.

    Example:
        ```python
        trainer = Trainer(callbacks=[LambdaCallback(on_train_epoch_end=lambda trainer, module: print("done"))])
        ```
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        for name, fn in hooks.items():
            if name not in HOOKS:
                close = difflib.get_close_matches(name, HOOKS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise TandemConfigError(
                    f"LambdaCallback: {name!r} is not a callback hook.{hint} Hooks: {', '.join(HOOKS)}."
                )
            if fn is not None and not callable(fn):
                raise TandemConfigError(f"LambdaCallback: {name} must be a function, got {fn!r}.")
        for name, fn in hooks.items():
            if fn is not None:
                setattr(self, name, fn)  # an instance attribute: the Trainer calls it in place of the no-op
