"""gRPC servicers: thin adapters between the wire and the controller."""
