"""Generated agentsessions.ext.v1: the project's additions beside the v1 contract (LiveSessions,
SessionCompaction).

Regenerate with ``make proto``; never edit the ``*_pb2*`` modules by hand.
"""
