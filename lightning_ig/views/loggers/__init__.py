"""What a run sends to the loggers.

* :mod:`~lightning_ig.views.loggers.outputs`: a run's scalars to every Lightning logger (``log_metrics``); to
  TensorBoard also its histograms, the report text and the pictures due (:class:`~.outputs.RunOutputs`);
* :mod:`~lightning_ig.views.loggers.worker`: the logging worker, which writes a run's TensorBoard events and
  pictures on one thread beside training, through ``SummaryWriter``'s public API;
* :mod:`~lightning_ig.views.loggers.sinks`: the pictures, the feature table and the JSON report for W&B and MLflow;
* :mod:`~lightning_ig.views.loggers.custom_scalars`: TensorBoard's Custom Scalars page of every IG callback.

A new logger output goes into :mod:`~lightning_ig.views.loggers.outputs` (a scalar into ``scalar_metrics``, its tag
into :class:`lightning_ig.views.tags.TagNames` and docs/tensorboard-tags.md); a new kind of logger, into
:mod:`~lightning_ig.views.loggers.sinks`.
"""

__all__: list[str] = []
