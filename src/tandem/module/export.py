"""Export a TrainingModule: to TorchScript (``to_torchscript``) and to ONNX (``to_onnx``), as Lightning's."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from tandem.utilities.exceptions import TandemConfigError, bad_choice

if TYPE_CHECKING:
    from tandem.module.training_module import TrainingModule


def export_torchscript(
    module: TrainingModule, file_path: str | os.PathLike | None, method: str, example_inputs: Any, **kwargs: Any
) -> Any:
    """[`TrainingModule.to_torchscript`][tandem.TrainingModule.to_torchscript]'s work, under its ``torch.no_grad()``."""
    if method not in ("script", "trace"):
        raise bad_choice("to_torchscript(method=...)", method, ("script", "trace"))
    mode = module.training
    module.eval()
    module._jit_is_scripting = True  # type: ignore[assignment]  # nn.Module types attributes as tensors or modules
    try:
        if method == "script":
            compiled = torch.jit.script(module, **kwargs)
        else:
            inputs = module.example_input_array if example_inputs is None else example_inputs
            if inputs is None:
                raise TandemConfigError(
                    "to_torchscript(method='trace') needs inputs to trace with: pass example_inputs=..., or set "
                    "self.example_input_array in __init__."
                )
            compiled = torch.jit.trace(module, example_inputs=_on_device(inputs, module.device), **kwargs)
    finally:
        module._jit_is_scripting = False  # type: ignore[assignment]  # a flag the trainer property reads
        module.train(mode)
    if file_path is not None:
        torch.jit.save(compiled, os.fspath(file_path))
    return compiled


def export_onnx(module: TrainingModule, file_path: str | os.PathLike, input_sample: Any, **kwargs: Any) -> None:
    """[`TrainingModule.to_onnx`][tandem.TrainingModule.to_onnx]'s work, under its ``torch.no_grad()``."""
    inputs = module.example_input_array if input_sample is None else input_sample
    if inputs is None:
        raise TandemConfigError(
            "to_onnx needs an input sample: pass input_sample=..., or set self.example_input_array in __init__."
        )
    mode = module.training
    module.eval()
    try:
        inputs = _on_device(inputs, module.device)
        torch.onnx.export(module, inputs if isinstance(inputs, tuple) else (inputs,), os.fspath(file_path), **kwargs)
    finally:
        module.train(mode)


def _on_device(inputs: Any, device: torch.device) -> Any:
    return apply_to_collection(inputs, torch.Tensor, lambda t: t.to(device))
