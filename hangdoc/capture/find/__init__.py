"""Find a job's rank processes on this node.

``jobspec`` parses what the user typed and ``jobsplit`` tells one job from several.
``discover`` finds the ranks: ``processes`` reads the process table, ``hosts`` this node's
names and addresses, ``slurm`` a Slurm job's processes, ``rankenv`` what a start-up
environment says about a rank, ``ranks`` decides which processes are ranks and their
numbers, ``owners`` whose job it is (over ``tcptable``, the kernel's TCP sockets), and
``wholejob`` what of the job runs elsewhere. ``ray_job`` asks a Ray cluster for a job's
workers (the one module of ``capture/`` that imports Ray) and ``ray_workers`` says what its
answers mean. ``redact`` keeps secrets of a command line and an environment on the node.
Imports only the ground floor.
"""
