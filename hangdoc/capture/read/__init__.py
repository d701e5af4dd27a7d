"""Read evidence from a node's live rank processes.

``sample`` takes one round of samples: py-spy stacks (``pyspy``) and kernel counters
(``procstate``). ``source`` keeps the lines around user frames and ``heartbeat_files``
reads step heartbeats, both read as the traced process could (``sourcefs``). ``gpu`` reads
the ranks' GPUs through NVML and ``ncclras`` NCCL's RAS report. ``probe_client`` asks a
rank's in-process probe (its answer read within a budget by ``boundedjson``), and
``flight_recorder`` reads the flight recorder dump it sends (a pickle through
``plainpickle``). Imports only the ground floor.
"""
