"""examples/digits.py driven by YAML configs and the command line: tandem.cli.CLI reads the options of
DigitsCNN, DigitsData and the Trainer from their signatures, type hints and docstrings.

    python examples/digits_cli.py fit --config examples/configs/digits.yaml
    python examples/digits_cli.py fit --config examples/configs/digits.yaml --config examples/configs/ddp.yaml
    python examples/digits_cli.py fit --config examples/configs/digits.yaml --trainer.max_epochs 5 model.lr=3e-3
    python examples/digits_cli.py fit --config examples/configs/digits.yaml --print_config   # the resolved YAML
    python examples/digits_cli.py fit --help                                                 # every option
    python examples/digits_cli.py fit --config examples/configs/digits.yaml --fast   # + configs/fast.yaml: a few batches

Each run saves its resolved config as config.yaml next to its logs; it reproduces the run, or resumes it:

    python examples/digits_cli.py fit --config runs/digits_cli/tandem_logs/version_0/config.yaml \\
        --ckpt_path last --trainer.max_epochs 40
    python examples/digits_cli.py test --config runs/digits_cli/tandem_logs/version_0/config.yaml --ckpt_path last
"""

from __future__ import annotations

import sys
from pathlib import Path

from digits import DigitsCNN, DigitsData  # examples/digits.py, next to this file

from tandem.cli import CLI

FAST = Path(__file__).parent / "configs" / "fast.yaml"


def main(argv: list[str] | None = None) -> CLI:
    """``--fast`` anywhere in the arguments adds configs/fast.yaml last (a few batches of one epoch)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--fast" in args:
        args.remove("--fast")
        args += ["--config", str(FAST)]
    return CLI(DigitsCNN, DigitsData, args=args)


if __name__ == "__main__":
    main()
