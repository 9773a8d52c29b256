import math

import torch

from tandem.utilities.logged_values import to_float


def test_to_float_reads_every_kind_of_logged_value_as_a_number_of_the_dtype_asked_for():
    """self.log keeps one-number float32 tensors (stacked as they are); other shapes and dtypes are converted first."""
    kept = torch.tensor(0.1)
    values = {
        "kept": kept,
        "one_element": torch.tensor([2.5]),
        "double": torch.tensor(1 / 3, dtype=torch.float64),
        "integer": torch.tensor(7),
        "bf16": torch.tensor(0.5, dtype=torch.bfloat16),
    }
    floats = to_float(values)
    assert list(floats) == list(values)  # the names in their order
    assert floats == {
        "kept": torch.tensor(0.1).item(),  # read in float32
        "one_element": 2.5,
        "double": torch.tensor(1 / 3, dtype=torch.float32).item(),  # float32 asked for: rounded to it
        "integer": 7.0,
        "bf16": 0.5,
    }
    assert all(type(v) is float for v in floats.values())
    assert kept.shape == () and kept.item() == floats["kept"]  # the logged tensor itself is left as it was
    exact = to_float(values, torch.float64)
    assert exact["double"] == 1 / 3 and exact["kept"] == torch.tensor(0.1).double().item()


def test_to_float_of_numbers_and_of_nothing():
    assert to_float({}) == {}
    mixed = to_float({"a": 1.5, "b": torch.tensor(float("nan"))})
    assert mixed["a"] == 1.5 and math.isnan(mixed["b"])
