"""How a training batch is optimized: ``AutomaticOptimization`` (the Trainer calls backward and steps)
or ``ManualOptimization`` (``training_step`` does, through ``self.optimizers()``).

Each owns the fit's optimizers and schedulers and has one ``run`` for the body of a batch;
the fit loop's batch runner owns what comes before and after it (the batch on its device, the batch hooks,
publishing the logged values). The optimizers ``self.optimizers()`` returns step through
``step`` of the object that wrapped them, then the strategy: never back through the loop.

One object per optimization mode, one file each (Lightning's ``loops/optimization/automatic.py`` and ``manual.py``):

- ``base``: ``Optimization``, what both modes share (the fit's optimizers and schedulers, the step's call);
- ``automatic``: ``AutomaticOptimization``, the Trainer's backward and steps;
- ``manual``: ``ManualOptimization``, the steps a ``training_step`` takes through ``self.optimizers()``;
- ``configure``: ``configure_optimization``, the fit's object built from ``configure_optimizers``.
"""
