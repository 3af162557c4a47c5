"""What a run sends to the loggers.

* :mod:`~lightning_ig.views.loggers.outputs`: a run's scalars to every Lightning logger; to TensorBoard also its
  histograms, the report text and the pictures due (:class:`~.outputs.RunOutputs`);
* :mod:`~lightning_ig.views.loggers.worker`: the logging worker, which writes a run's TensorBoard events and pictures
  on one thread beside training, through ``SummaryWriter``'s public API;
* :mod:`~lightning_ig.views.loggers.sinks`: the pictures, the table of units and the JSON report for W&B and MLflow.

A scalar goes into :func:`~.outputs.scalar_metrics` (its tag into docs/tensorboard-tags.md); a new kind of logger
into :mod:`~lightning_ig.views.loggers.sinks`.
"""

__all__: list[str] = []
