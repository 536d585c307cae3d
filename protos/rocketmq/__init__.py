"""Generated stubs of RocketMQ 5's gRPC protocol (``apache.rocketmq.v2``), under tidemq's namespace:
``definition_pb2``, ``service_pb2`` and ``service_pb2_grpc`` (``make protos``)."""
