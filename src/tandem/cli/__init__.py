"""A command line and YAML configs for tandem programs, on omegaconf: ``CLI(MyModel, MyData)`` in a script gives
``python train.py fit --config config.yaml --trainer.max_epochs 5 model.lr=0.01``.

- ``cli.py``: ``CLI`` (also ``LightningCLI``): parse, build, run the subcommand, the hooks around each, ``--print_config``;
- ``subcommands.py``: the subcommands, the Trainer method's arguments each adds, ``parser_kwargs``;
- ``parser.py``: ``LightningArgumentParser``, what a subclass's ``add_arguments_to_parser`` adds;
- ``links.py``: ``link_arguments``' links: checked, applied when parsing, or when building;
- ``help.py``: ``--help``;
- ``seed.py``: ``seed_everything``, ``true`` turned into one seed for every rank;
- ``config/``: layering, interpolation, checking values, building objects (pure: no processes, no files);
- ``arguments.py``: signatures, type hints, docstring help;
- ``class_paths.py``: ``class_path`` names to classes and back;
- ``errors.py``: ``CLIError``, one helper per kind of mistake;
- ``save_config.py``: ``SaveConfigCallback``, the run's ``config.yaml``.
"""

from tandem.cli.cli import CLI, LightningCLI, LRSchedulerCallable, OptimizerCallable
from tandem.cli.errors import CLIError
from tandem.cli.parser import LightningArgumentParser
from tandem.cli.save_config import SaveConfigCallback

__all__ = [
    "CLI",
    "CLIError",
    "LRSchedulerCallable",
    "LightningArgumentParser",
    "LightningCLI",
    "OptimizerCallable",
    "SaveConfigCallback",
]
