"""Fixtures of the console's browser tests: the integration tests' real nameserver and broker
processes, a real ``tidemq console`` process and Debian's Chromium (``harness``)."""

from tests.console.harness import browser, start_console  # noqa: F401 - fixtures
from tests.integration.conftest import (  # noqa: F401 - fixtures and the report hook
    pytest_runtest_makereport,
    start_broker,
    start_nameserver,
)
