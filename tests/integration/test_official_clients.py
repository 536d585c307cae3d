"""The official RocketMQ 5 clients, each unmodified in its own environment and process, against a
real tidemq broker's ``--rocketmq-listen`` endpoint: the Python client (PyPI
rocketmq-python-client 5.1.2, in .venv-rocketmq) and the Node.js client (npm
rocketmq-client-nodejs 1.0.8, in tests/interop/node). Each test runs once per client: sends of
every kind, the SimpleConsumer and the PushConsumer, and messages crossing to and from tidemq's
own SDK (the checks: tests/integration/official_clients.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import official_clients as scenario
from tests.integration.official_clients import V2Cluster, client_programs, v2_cluster
from tests.interop.clients import NODE, PYTHON, OfficialClient, Programs

pytestmark = pytest.mark.integration


# The docs page shows one example per client; the test runs it as printed.
DOCS_EXAMPLES = {"python": "official_python_client.py", "node": "official_node_client.js"}


@pytest.fixture(scope="module", params=[PYTHON, NODE], ids=lambda c: c.name)
def client(request: pytest.FixtureRequest) -> OfficialClient:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def v2(client: OfficialClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Cluster]:
    """A cluster per client: the scenarios' topics and groups are the same for both."""
    with v2_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
def programs(client: OfficialClient, tmp_path: Path) -> Iterator[Programs]:
    with client_programs(client, tmp_path) as p:
        yield p


def test_a_message_with_tag_keys_and_properties_arrives_with_them_once_acked(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.tag_keys_and_properties(v2, programs)


def test_fifo_messages_of_each_group_arrive_in_send_order(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.fifo_in_order(v2, programs)


def test_a_delayed_message_arrives_at_its_delivery_time_not_before(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.delayed_not_before_its_time(v2, programs)


def test_transactions_commit_roll_back_and_an_open_one_is_committed_by_the_checker(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.transactions_commit_rollback_and_check(v2, programs)


def test_a_changed_invisible_duration_brings_the_message_back_then_with_attempt_2(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.change_invisible_then_redelivered(v2, programs)


def test_push_consumer_failures_are_retried_until_the_listener_succeeds(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.push_retries_then_succeeds(v2, programs)


def test_push_consumer_failing_every_delivery_sends_the_message_to_the_dlq(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.push_dead_letters_after_max_attempts(v2, programs)


def test_a_message_sent_by_the_official_client_is_received_by_tidemqs_sdk(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.official_producer_to_tidemq_consumer(v2, programs)


def test_a_message_sent_by_tidemqs_sdk_is_received_by_the_official_client(
    v2: V2Cluster, programs: Programs
) -> None:
    scenario.tidemq_producer_to_official_consumer(v2, programs)


def test_the_docs_example_sends_and_receives(v2: V2Cluster, programs: Programs) -> None:
    scenario.docs_example(v2, programs, DOCS_EXAMPLES[programs.client.name])
