"""Every page with a Python example is one whose examples a test runs as printed.

``tests/unit/test_docs_tool_examples.py`` runs the tool author's pages,
``tests/integration/test_client_doc_examples.py`` the client, agent and MCP pages (they
need a fleet). A page that gains its first example fails here until a test runs it.
"""

from __future__ import annotations

import pytest

from tests.support.doc_examples import ROOT, examples

pytestmark = pytest.mark.unit

RUN_BY_TESTS = {
    "writing-tools.md": "tests/unit/test_docs_tool_examples.py",
    "documents.md": "tests/unit/test_docs_tool_examples.py",
    "registry.md": "tests/unit/test_docs_tool_examples.py",
    "publishing.md": "tests/integration/test_client_doc_examples.py",
    "agent-runner.md": "tests/integration/test_client_doc_examples.py",
    "mcp.md": "tests/integration/test_client_doc_examples.py",
}


def test_every_page_with_a_python_example_is_run_by_a_test() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    with_examples = {p.name for p in pages if examples(p)}
    assert with_examples <= set(RUN_BY_TESTS), with_examples - set(RUN_BY_TESTS)
    for page, test in RUN_BY_TESTS.items():
        assert page.removesuffix(".md") in (ROOT / test).read_text("utf-8").replace("_", "-")
