"""Starting the other processes of a DDP job, and ending all of them when one fails.

``ScriptLauncher`` ("ddp") re-runs the user's script for the other local ranks; the original process
is rank 0. Everything the script does runs on every rank, code after ``trainer.fit()`` included, as
in plain torch DDP scripts. ``SpawnLauncher`` ("ddp_spawn") runs one function in spawned processes
and brings rank 0's results back to the caller, for code that cannot be re-run as a script
(notebooks, ``python -c``): guard the script with ``if __name__ == "__main__":``.

A launcher is used as ``launcher.launch(function, *args, trainer=trainer, **kwargs)``; it returns
what ``function`` returned on this process (ScriptLauncher) or on global rank 0 (SpawnLauncher).

When a rank fails, the others are stopped and the failure is raised as
[`RankFailedError`][tandem.utilities.exceptions.RankFailedError], with the failing rank's traceback, in the process the
user watches: rank 0 under ``ddp`` (in its main thread, wherever it is, so its ``finally`` blocks and context managers
run), the caller under ``ddp_spawn``. Each started rank writes the traceback of the error that ends it to a file of its
own (atomically: a reader never sees half of it) and, under ``ddp``, leaves printing it to rank 0: each
traceback is printed once for the job, and an error that every rank raised is printed once, naming the
ranks. A rank killed by a signal writes none and is reported by its signal. Before stopping the ranks,
the launcher announces the teardown through the side channel, so that they take its SIGTERM for what it
is (not a pre-emption) and end at once. Ctrl-C (SIGINT to the job's process group) reaches every rank, and
they end in any order: a started rank that it ended is no failure once rank 0 shows a KeyboardInterrupt of its
own, which is what rank 0 raises.

One module per job: ``launcher.py`` (the contract), ``script.py`` (``ScriptLauncher``), ``spawn.py``
(``SpawnLauncher`` and the payload it brings back), ``command.py`` (the command a started rank runs),
``records.py`` (error records and the failure messages), ``watchdog.py`` (rank 0 watching the ranks it started, a
started rank watching its launcher), ``pickling.py`` (what ddp_spawn could not pickle, and why).
"""

from tandem.strategies.launchers.launcher import Launcher
from tandem.strategies.launchers.script import ScriptLauncher
from tandem.strategies.launchers.spawn import SpawnLauncher

__all__ = ["Launcher", "ScriptLauncher", "SpawnLauncher"]
