"""What ``self.log`` collects: step values, epoch aggregates, cross-process reduction, and routing.

One ``MetricCollector`` per Trainer. Values stay tensors on the device (no host sync per step); they are
turned into floats only when a logger or the progress bar needs them. Epoch means are kept as a
weighted sum and a count, reduced across processes as sums and counts, then divided.

Values logged with ``sync_dist=True`` are reduced across processes by name, never by the order they were
logged in. Every rank packs the names it needs reduced, sorted, with their values (read as floats, one
conversion per rank: ``pack``); when every rank packed alike (one small all-reduce of the layout's hash
says so), the values are reduced as packed sums and maxima, whose size does not grow with the ranks. When the
names differ (conditional logging), every rank gathers what each sent and reduces the union of names the same
way, in rank order (``combine_by_name``); a rank without a value counts as absent. Epoch values are reduced
once per epoch end; step values at the steps whose values are published (every ``log_every_n_steps`` steps and
at the epoch's end), never on the steps in between.

The package, one job a file:

- ``collector``: ``MetricCollector``, what ``self.log`` writes into, and what it publishes;
- ``entry``: one logged name's record (``_Entry``) and the keys its values are published under;
- ``checks``: where ``self.log`` may be called, and with what (Lightning's rules);
- ``reduction``: the reduction across processes, by name (packed when the ranks agree, gathered when not);
- ``sink``: ``LogSink``, where logged numbers go (the loggers and ``trainer.logged_metrics``);
- ``barebones`` and ``compiled``: what ``self.log`` writes into under ``Trainer(barebones=True)`` and while the
  steps run compiled.
"""
