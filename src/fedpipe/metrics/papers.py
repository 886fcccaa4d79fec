"""The papers whose evaluation metrics the evaluate stage reports beside the generic ones, each in a
module of its own (``fedpipe.metrics.<paper>``), which the stage loops over and never names:

- ``KEY``: the paper (``study.papers``' key);
- ``run_metrics(run: RunModels) -> dict``: the paper's metrics of one run (algorithm, seed), from its
  models and the shared passes over the test sets (:class:`fedpipe.metrics.runs.RunModels`), for every
  method of the study that has what the metric needs;
- ``COLUMNS``: ``(metric, header)`` of the comparison table, shown when some method has the metric,
  after the generic and personalized columns, in the order of :data:`PAPERS`; ``UNSCALED``: those
  shown as they are rather than in %;
- ``LEGEND``: sentences the table's legend adds; ``notes(metrics)``: paragraphs under it.

A new paper's metric is a module with these five names and its entry in :data:`PAPERS`."""

from fedpipe.metrics import equitable, fednh, perada

PAPERS = (fednh, equitable, perada)
