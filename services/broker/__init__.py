"""The broker process: the gRPC Broker service over an embedded MessageStore."""
