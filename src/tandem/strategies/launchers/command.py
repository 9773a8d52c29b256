"""The command that starts a local rank: this program again (``python script.py args`` or ``python -m
module args``), or under a Hydra app, this Hydra job."""

from __future__ import annotations

import os
import sys
from typing import Any

from tandem.utilities.exceptions import TandemConfigError


def script_command() -> list[str]:
    """The command that re-runs this program: ``python script.py args`` or ``python -m module args``."""
    return [*_program(), *sys.argv[1:]]


def _program() -> list[str]:
    """``python script.py`` or ``python -m module``: this program, without its arguments."""
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", "__mp_main__"):
        name = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return [sys.executable, "-m", name]
    main_file = getattr(__main__, "__file__", None)
    if main_file is None or sys.argv[0] in ("", "-c"):
        raise TandemConfigError(
            "strategy='ddp' starts the other ranks by re-running your script, but this program has no script "
            "(an interactive session, a notebook or python -c). Use strategy='ddp_notebook' (it forks this process, "
            "so classes defined here come along) or 'ddp_spawn' (classes from importable modules), or run a script."
        )
    return [sys.executable, os.path.abspath(sys.argv[0])]


def child_command(local_rank: int) -> tuple[list[str], str | None]:
    """The command (and working directory) that starts local rank ``local_rank``: this program again, or, under a
    Hydra app, this Hydra job: the program with the job's own overrides, in the parent's resolved run folder
    (``hydra.run.dir``), without ``-m`` / sweep arguments and without writing Hydra's config files again (as
    Lightning does). Re-running ``sys.argv`` unchanged would give each rank a run folder of its own and, under
    ``-m``, a sweep of its own."""
    hydra_config = _hydra_config()
    if hydra_config is None:
        return script_command(), None
    from hydra.utils import get_original_cwd

    return [
        *_program(),
        *hydra_config.overrides.task,  # this job's values (a sweep's, resolved), not the sweep
        f'hydra.run.dir="{hydra_config.runtime.output_dir}"',
        "hydra.output_subdir=null",  # rank 0 wrote the job's .hydra folder
        f"hydra.job.name={hydra_config.job.name}_rank{local_rank}",  # its own log file beside rank 0's
    ], get_original_cwd()


def _hydra_config() -> Any:
    """The running Hydra job's config, or None outside a Hydra app (Hydra is never imported here)."""
    if "hydra" not in sys.modules:
        return None
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None
