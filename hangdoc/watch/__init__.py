"""``hangdoc watch``: the watchdog that runs beside a training job, notices when its steps
stop, diagnoses it while it is hung, and keeps the evidence (docs/watch.md).

- ``watchdog``: ``run_watch`` and the ``Watchdog`` that wires one watch; the wrapped and
  the attached way to run it.
- ``config``: ``WatchConfig`` and ``OnHang``, what a watch is asked to do.
- ``loop``: the checks; ``respond``: what is done about a stall (diagnose, judge, fire).
- ``pace`` and ``activity``: the job's activity, as stall clocks and as their sources.
- ``stall``: when a silence is a stall, and the judgement of a diagnosis taken during one.
- ``supervisor``: the wrapped command; ``tracked``: an attached job's rank processes;
  ``job``: naming and ending the job; ``jobcontrol``: ending process trees.
- ``hooks``: the ``--on-hang exec`` commands; ``incident``: the hang directory;
  ``metrics``: the Prometheus page.
"""
