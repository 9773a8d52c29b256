"""What a hook's signature asks for (the rules of Lightning's ``is_param_in_hook_signature``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

#: the parameter that makes a step the ``dataloader_iter`` flavour
PARAMETER = "dataloader_iter"


def takes_dataloader_iter(step: Callable[..., Any]) -> bool:
    """Whether ``step`` names a ``dataloader_iter`` parameter itself (``*args`` does not count; Lightning's
    ``is_param_in_hook_signature(step, "dataloader_iter", explicit=True)``)."""
    step = getattr(step, "__wrapped__", step)
    try:
        parameters = inspect.signature(step).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get(PARAMETER)
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
