"""The agent gRPC API behind one door.

``v1/`` holds the code generated from ``proto/hangdoc/v1/agent.proto`` (``make proto``;
never edit it by hand). ``convert`` translates between those messages and the data model;
apart from the agent server and client, nothing else in hangdoc imports ``*_pb2``.
"""

API_VERSION = "hangdoc.v1"
