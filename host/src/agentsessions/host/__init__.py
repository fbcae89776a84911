"""The agentsessions.v1 host: durable journal, controller and gRPC services."""
