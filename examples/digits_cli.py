"""examples/digits.py driven by YAML configs and the command line: tandem.cli.CLI reads the options of
DigitsCNN, DigitsData and the Trainer from their signatures, type hints and docstrings.

    python examples/digits_cli.py fit --config examples/configs/digits.yaml
    python examples/digits_cli.py fit --config examples/configs/digits.yaml --config examples/configs/ddp.yaml
    python examples/digits_cli.py fit --config examples/configs/digits.yaml --trainer.max_epochs 5 model.lr=3e-3
    python examples/digits_cli.py fit --config examples/configs/digits.yaml --print_config   # the resolved YAML
    python examples/digits_cli.py fit --help                                                 # every option

Each run saves its resolved config as config.yaml next to its logs; it reproduces the run, or resumes it:

    python examples/digits_cli.py fit --config runs/digits_cli/tandem_logs/version_0/config.yaml \\
        --ckpt_path last --trainer.max_epochs 40
    python examples/digits_cli.py test --config runs/digits_cli/tandem_logs/version_0/config.yaml --ckpt_path last
"""

from digits import DigitsCNN, DigitsData  # examples/digits.py, next to this file

from tandem.cli import CLI

if __name__ == "__main__":
    CLI(DigitsCNN, DigitsData)
