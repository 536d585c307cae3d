"""The check after ``test_bad_input*``'s bad requests: the broker still sends and pulls, stored
nothing it refused, answered none with INTERNAL, and its store checks clean after a stop."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.integration.bad_input import LONG_POLL_MAX_MS, Broker, good_message
from tests.integration.test_broker_operations import sample, scrape
from tidemq.protos import broker_pb2


def assert_works_and_store_checks_clean(broker: Broker) -> None:
    s = broker.stub
    status = s.GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)
    assert status.store.commitlog_max_offset == broker.baseline_end  # nothing refused was stored
    assert status.running and status.store.writable
    sent = s.SendMessage(
        broker_pb2.SendMessageRequest(messages=[good_message(0)]), timeout=10
    ).results
    assert [r.status for r in sent] == [broker_pb2.SEND_OK]
    got = s.PullMessage(
        broker_pb2.PullMessageRequest(
            topic="orders", queue_id=0, offset=0, long_poll_timeout_ms=LONG_POLL_MAX_MS
        ),
        timeout=10,
    )
    deadline = time.monotonic() + 20
    while not got.messages and time.monotonic() < deadline:
        got = s.PullMessage(
            broker_pb2.PullMessageRequest(
                topic="orders", queue_id=0, offset=0, long_poll_timeout_ms=LONG_POLL_MAX_MS
            ),
            timeout=10,
        )
    assert [m.body for m in got.messages] == [b"fine"]

    metrics = scrape(broker.metrics)
    codes = {
        dict(labels)["code"] for name, labels in metrics if name == "tidemq_rpc_requests_total"
    }
    assert "INTERNAL" not in codes
    assert sample(metrics, "tidemq_send_messages_total", topic="orders", status="SEND_OK") == 1

    assert broker.process.terminate() == 0
    log = broker.process.log()
    assert "Traceback" not in log, log
    check = subprocess.run(
        [sys.executable, "-m", "tidemq.cli", "store", "check", str(broker.process.store_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "OK" in check.stdout.splitlines()[0]
    assert "shutdown:        clean" in check.stdout
