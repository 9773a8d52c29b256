"""From a command line to a checked config, and from the config to objects. Pure: nothing here starts a process
or writes a file, so every mistake is reported before a run begins.

Layering, lowest first: the classes' signature defaults < each ``--config FILE.yaml`` in order < the command
line's overrides (``--trainer.max_epochs 5``, ``--model.lr=0.01`` or ``trainer.max_epochs=5``). Then:

1. ``complete``: every section filled with its defaults, each ``class_path`` resolved and its ``init_args``
   completed, unknown keys refused (required values without a default are marked ``???``);
2. ``resolve``: omegaconf interpolation (``${model.hidden}``, ``${oc.env:DATA_DIR}``);
3. ``check``: every value against its type hint (``model.lr=abc`` -> expected float);
4. ``build``: the objects, once the caller wants them.

One step a file:

- ``schema.py``: the top-level keys (``Schema``), the class sections (``Section``), a class spec (``is_spec``);
- ``request.py``: the command line's tokens split into config files, overrides and flags (``parse_argv``);
- ``yaml_io.py``: YAML through omegaconf: values and config files read, interpolation (``resolve``), ``to_yaml``;
- ``layers.py``: the layers merged (``layer``), dotted paths into a config (``set_path``, ``get_path``, ...);
- ``complete.py``: 1., and the defaults as YAML values (``plain_default``);
- ``check.py``: 3.;
- ``build.py``: 4.
"""

# pickles (a module saved whole, its hparams) name the callable a class_path gives by its module of before the split
from tandem.cli.config.build import ClassCallable

__all__ = ["ClassCallable"]
