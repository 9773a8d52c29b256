import warnings

import tandem
from helpers import quiet_trainer
from tandem.trainer import checkpointing
from tandem.utilities import TandemWarning


def test_tandems_warnings_format_as_one_line_without_tandems_file_and_source():
    trainer = quiet_trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpointing.find_last_checkpoint(trainer)  # warns from tandem/trainer/checkpointing.py
    (warning,) = caught
    assert warning.filename.endswith("checkpointing.py") and issubclass(warning.category, TandemWarning)
    text = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno, None)
    assert text == "TandemWarning: ckpt_path='last' found no last.ckpt yet; training starts from scratch.\n"


def test_other_warnings_keep_pythons_format():
    text = warnings.formatwarning("careful", UserWarning, __file__, 3, "x = 1")
    assert text.startswith(f"{__file__}:3: UserWarning: careful") and "x = 1" in text
    assert tandem.__version__  # importing tandem did not break the default format
