"""A registry's route (``route_table``) in the nameserver protocol's form: what a nameserver
answers to QueryRoute, and what a broker that reads routes from ZooKeeper itself builds."""

from __future__ import annotations

from tidemq.protos import nameserver_pb2
from tidemq.services.nameserver.route_model import BrokerData, TopicRoute


def broker_data_to_wire(b: BrokerData) -> nameserver_pb2.BrokerData:
    return nameserver_pb2.BrokerData(
        cluster=b.cluster,
        broker_name=b.broker_name,
        addresses=b.addresses,
        ha_addresses=b.ha_addresses,
        epoch=b.epoch,
        rocketmq_addresses=b.rocketmq_addresses,
    )


def route_to_wire(route: TopicRoute) -> nameserver_pb2.QueryRouteResponse:
    return nameserver_pb2.QueryRouteResponse(
        topic=route.topic,
        queues=[
            nameserver_pb2.QueueData(
                broker_name=q.broker_name,
                read_queue_nums=q.read_queue_nums,
                write_queue_nums=q.write_queue_nums,
                perm=q.perm,
            )
            for q in route.queues
        ],
        brokers=[broker_data_to_wire(b) for b in route.brokers],
    )
