"""Capture: find a job's rank processes on this node and record what they are doing.

``jobspec`` parses what the user typed. ``discover`` finds the ranks: ``processes`` reads
the process table, ``hosts`` this node's names and addresses, ``slurm`` a Slurm job's
processes, ``rankenv`` what a start-up environment says about a rank, and ``ranks`` decides
which processes are ranks and their numbers. ``sample`` takes one round of samples: py-spy
stacks (``pyspy``) and kernel counters (``procstate``). ``source`` keeps the lines around
user frames and ``heartbeat_files`` reads step heartbeats, both read as the traced process
could (``sourcefs``); ``redact`` keeps secrets on the node. ``dumpfile`` builds a snapshot
from the stack dumps a user already has (py-spy's text and JSON, ``ray stack``), for
``hangdoc analyze``. Imports only the ground floor.
"""
