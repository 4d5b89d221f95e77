"""The stream driver: the one step per micro-batch, with carried state, exactly once.

* :mod:`.job`: :func:`~.job.start_stream` (a streaming DataFrame from any
  source) and :class:`~.job.StreamJob` (``tickwheel pipeline stream`` over a
  directory of files); the ``foreachBatch`` runner and the commit protocol;
* :mod:`.micro_batch`: one micro-batch: the step with the carried state, then
  the commit;
* :mod:`.checkpoint`: the checkpoint's lock, state store, plans and fault points;
* :mod:`.file_source`: the command line's source of files, in (modification
  time, name) order;
* :mod:`.progress`: each micro-batch's figures in Spark's progress, through a
  companion query;
* :mod:`.cli`: the command line's options.

Importing this package does not import pyspark.
"""
