"""The stream driver: the one step per micro-batch, with carried state, exactly once.

* :mod:`.start`: :func:`~.start.start_stream` (a streaming DataFrame from any
  source) and :func:`~.start.read_stream_outputs`; the commit protocol;
* :mod:`.file_job`: :class:`~.file_job.StreamJob` (``tickwheel pipeline
  stream`` over a directory of files);
* :mod:`.runner`: what both drivers share around their query: the
  ``foreachBatch`` runner, the trigger, the checks before the first batch;
* :mod:`.micro_batch`: one micro-batch: the step with the carried state, then
  the commit;
* :mod:`.checkpoint`: the checkpoint's lock, state store, plans and fault points;
* :mod:`.file_source`: the command line's source of files, in (modification
  time, name) order; :mod:`.file_log`, its log of the files taken (no pyspark);
* :mod:`.status` and :mod:`.status_report`: a checkpoint's figures, and the
  report of them;
* :mod:`.progress`: each micro-batch's figures in Spark's progress, through a
  companion query;
* :mod:`.cli`: the command line's options.

Importing this package does not import pyspark.
"""
