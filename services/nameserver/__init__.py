"""The nameserver: which broker groups serve which topic.

``route_table`` is the pure state (RocketMQ's RouteInfoManager), ``registry`` the backends that
own a table (embedded heartbeats today, ZooKeeper later), ``servicer`` the gRPC handlers and
``server`` the process.
"""
