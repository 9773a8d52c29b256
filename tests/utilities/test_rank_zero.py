import warnings

import tandem
from helpers import quiet_trainer


def test_tandems_warnings_format_as_one_line_without_tandems_file_and_source():
    trainer = quiet_trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer._find_last_checkpoint()  # warns from tandem/trainer/trainer.py through rank_zero_warn
    (warning,) = caught
    assert warning.filename.endswith("trainer.py")
    text = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno, None)
    assert text == "UserWarning: ckpt_path='last' found no last.ckpt yet; training starts from scratch.\n"


def test_other_warnings_keep_pythons_format():
    text = warnings.formatwarning("careful", UserWarning, __file__, 3, "x = 1")
    assert text.startswith(f"{__file__}:3: UserWarning: careful") and "x = 1" in text
    assert tandem.__version__  # importing tandem did not break the default format
