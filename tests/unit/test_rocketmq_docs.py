"""The examples of docs/rocketmq-clients.md are the files the integration tests run
(docs/examples/official_*_client.*), verbatim: the page cannot drift from what is tested."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize(
    ("example", "fence"),
    [("official_python_client.py", "python"), ("official_node_client.js", "js")],
)
def test_the_docs_page_shows_the_tested_example_verbatim(example: str, fence: str) -> None:
    page = (DOCS / "rocketmq-clients.md").read_text()
    code = (DOCS / "examples" / example).read_text()
    assert f"`docs/examples/{example}`" in page
    assert f"```{fence}\n{code}```" in page
