"""The stream driver: the one step per micro-batch, with carried state, exactly once.

How a micro-batch commits, and what owns a checkpoint, is told once in
``docs/pipeline-design.md`` ("One micro-batch", "Commit protocol (exactly once)",
"Concurrency and faults"). By role (imports run down this list, never up):

* :mod:`.checkpoint`: the checkpoint, by concern: its errors, fault points
  (a test hook), owner, typed commit records and commit log (``StateStore``);
* :mod:`.resident`: the state held between micro-batches by the process that
  runs them; :mod:`.changelog`: its versions in the checkpoint, snapshots and
  changelogs, written and rebuilt;
* :mod:`.evolution`: a rules change under a running stream;
* :mod:`.micro_batch`: one micro-batch: the step, the check, the commit, the
  publication;
* :mod:`.runner`: ``foreachBatch``'s function, each micro-batch once, in order;
* :mod:`.progress`: each micro-batch's figures in Spark's progress, through a
  companion query;
* :mod:`.query`: the query assembled and watched, as both drivers start it;
* :mod:`.start`: :func:`~.start.start_stream` (a streaming DataFrame from any
  source) and :func:`~.start.read_stream_outputs`;
* :mod:`.file_source` and :mod:`.file_log`: the command line's source of files,
  in (modification time, name) order, and its log of the files taken (no
  pyspark); :mod:`.file_job`: :class:`~.file_job.FileStreamJob` (``tickwheel
  pipeline stream`` over a directory of files);
* :mod:`.status` and :mod:`.status_report`: a checkpoint's figures, and the
  report of them;
* :mod:`.cli`: the command line's options.

Importing this package does not import pyspark.
"""
