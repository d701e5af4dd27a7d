"""Fleet: the job across nodes, and the gRPC agent API behind one door.

``node.Node`` is one machine's view of a job: ``LocalNode`` captures here, ``client.RemoteNode``
asks a ``hangdoc agent`` over gRPC (``agent`` is that server; ``callers`` and ``credfiles``
decide who may ask what). ``coordinator`` fans a call out to every node. ``v1/`` holds the
code generated from ``proto/hangdoc/v1/agent.proto`` (``make proto``; never edit it by hand)
and ``wire`` translates between those messages and the data model: apart from ``wire``,
the agent and the client, nothing in hangdoc imports the generated code. Imports capture
and the ground floor.
"""
