"""What runs on Spark: the one delayed-operations step, one module per stage.

Both drivers (:mod:`tickwheel.pipeline.batch` and
:mod:`tickwheel.pipeline.stream`) call the same stages, in this order:

* :mod:`.records`: records of any form → validated rows (stage 1), with
  :mod:`.maxwell` for Maxwell's binlog JSON;
* :mod:`.classify`: classes and deduplication by event id (stage 2);
* :mod:`.watermark`: the counts, and the watermark (stage 3);
* :mod:`.fanout`: one row per (event, rule) (stage 4);
* :mod:`.partition`: one purgatory per key partition, Arrow in and out (stage 5);
* :mod:`.outputs`: the tables, the next state and the counters (stage 6);
* :mod:`.step`: the step that runs them, :class:`~.step.DelayedOperations`,
  with :mod:`.placement` saying where its purgatory runs (Spark's partitions,
  or the driver) and how wide.

And what the command line needs around them: :mod:`.files` (files → a records
frame), :mod:`.session` (the SparkSession and a job's settings),
:mod:`.class_archive` (the JVM's class archive), :mod:`.worker_daemon` (the
Python workers' daemon) and :mod:`.frames` (small frame helpers).

Nothing here is imported by ``import tickwheel.pipeline``; every module needs
the ``spark`` extra.
"""
