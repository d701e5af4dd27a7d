"""Capture: on one node, a job's evidence, in three rooms by what each does.

``find/`` finds the job's rank processes on this node: what the user typed (``jobspec``),
the process table, this node's names, Slurm, Ray and the start-up environments, and which
processes are ranks (``discover`` over them). ``read/`` reads evidence from those live
processes: py-spy stacks and kernel counters (``sample``), source lines and heartbeat files
as the process could read them, its GPUs and NCCL's RAS report, and its probe (with the
flight recorder dump it sends). ``dumps/`` reads the files a user already has, offline, into
a snapshot for ``hangdoc analyze`` (``dumpfile``: py-spy and ``ray stack`` dumps, flight
recorder dump directories).

Imports run one way: ``find/`` and ``read/`` import neither each other nor ``dumps/``;
``dumps/`` reads dumps with what the other two know (py-spy's words, the flight recorder's
format, a rank's environment, redaction). All three import only the ground floor besides.
This package itself imports nothing.
"""
