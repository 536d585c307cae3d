"""The Broker service's handlers, one module per concern. ``servicer.BrokerServicer`` is what
gRPC sees; it hands each RPC to the group here that owns it, and every group answers through the
shared checks of ``checks``."""
