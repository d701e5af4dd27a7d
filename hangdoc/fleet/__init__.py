"""Fleet: the job across nodes, and the gRPC agent API behind one door.

``node.Node`` is one machine's view of a job: ``LocalNode`` captures here, ``client.RemoteNode``
asks a ``hangdoc agent`` over gRPC (``agent`` is that server; ``callers`` and ``credfiles``
decide who may ask what). ``coordinator`` fans a call out to every node (``fan_out_pids``: a
call about each node's ranks), and ``gather`` takes one diagnosis's capture across them
step by step (rounds, ``probes``, ``devices``, native samples). ``v1/`` holds the
code generated from ``proto/hangdoc/v1/agent.proto`` (``make proto``; never edit it by hand)
and ``wire`` translates between those messages and the data model: apart from ``wire``,
the agent and the client, nothing in hangdoc imports the generated code. Imports capture
and the ground floor.
"""
