"""Generated agentsessions.v1 contract (protobuf messages and gRPC stubs).

Regenerate with ``make proto``; never edit the ``*_pb2*`` modules by hand.
"""
