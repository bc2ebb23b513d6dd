"""The tool-writing pages' examples run as printed, import only the SDK, and declare
what the pages say they declare."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from tests.support.doc_examples import ROOT, examples, run_page
from toolfleet.contract.manifest import FilesystemAccess, ResourceDefaults
from toolfleet.sdk import Cache, Isolation, ToolLimits, spec_of

pytestmark = pytest.mark.unit

PAGES = [ROOT / "docs" / name for name in ("writing-tools.md", "documents.md", "registry.md")]
#: What a tool author imports toolfleet from.
SDK = {"toolfleet.sdk", "toolfleet.sdk.testing"}


def _toolfleet_imports(code: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "toolfleet"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_tool_pages_import_toolfleet_only_from_the_sdk(page: Path) -> None:
    blocks = examples(page)
    assert blocks, f"{page.name} has no python example"
    for block in blocks:
        outside = _toolfleet_imports(block.code) - SDK
        assert not outside, f"{block.where} imports {sorted(outside)}: use toolfleet.sdk"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_example_of_the_tool_pages_runs(page: Path) -> None:
    skipped = [block.where for block in examples(page) if block.not_run is not None]
    assert skipped == []


async def _page(name: str) -> dict[str, Any]:
    return await run_page(ROOT / "docs" / name)


async def test_writing_tools_declares_what_the_page_says() -> None:
    ns = await _page("writing-tools.md")

    weather = spec_of(ns["weather"])
    assert (weather.tool_id, weather.timeout_seconds) == ("acme__weather", 10.0)
    assert weather.description == "Current temperature in a city."

    repo = spec_of(ns["repo"])
    manifest = repo.manifest()
    assert manifest.retry_policy.max_attempts == 3
    assert manifest.circuit.name == "api.github.com"
    assert repo.cache == Cache(mode="ttl", ttl_s=60)

    repos = spec_of(ns["repos"]).manifest()
    assert repos.credentials == repos.permissions.credentials == ["api_key"]
    assert repos.permissions.network == ["api.github.com"]

    count_files = spec_of(ns["count_files"])
    assert count_files.manifest().isolation == "process"
    assert count_files.isolation is Isolation.PROCESS
    assert count_files.limits == ToolLimits(memory_mb=256, cpu_millicores=500)
    assert count_files.manifest().permissions.filesystem == [FilesystemAccess(path="/data/*")]
    assert count_files.manifest().resource_defaults == ResourceDefaults()

    count_words = spec_of(ns["count_words"])
    assert count_words.command[0] == "/usr/bin/python3"
    assert count_words.manifest().isolation == "sandbox"


async def test_writing_tools_testing_kit_examples_pass() -> None:
    ns = await _page("writing-tools.md")
    await ns["test_weather"]()
    await ns["test_batch_resumes"]()


async def test_writing_tools_result_rules_apply_as_described() -> None:
    ns = await _page("writing-tools.md")
    rules = spec_of(ns["search"]).manifest().result_rules
    assert (rules.mode, rules.max_bytes) == ("coerce", 1_000_000)
    assert rules.sanitize["$.tags[*]"].checks == ("prompt_injection",)

    run = await ns["run_tool"](ns["search"], {"query": "refunds"})
    assert run.ok
    assert run.result["body"] == "&lt;script&gt;steal()&lt;/script&gt;Within 30 days."
    assert run.warnings == ["result field $.body: html.script escaped"]


async def test_documents_example_reads_and_pins_the_named_document() -> None:
    ns = await _page("documents.md")
    assert ns["run"].ok
    assert ns["run"].result == {"summary": "Refunds within 30 days."}
    assert {(a.document_id, a.version) for a in ns["docs"].accessed} == {("handbook", "1")}


async def test_registry_example_registers_the_manifest_the_page_describes() -> None:
    ns = await _page("registry.md")
    manifest = ns["manifest"]
    assert manifest.requires_approval
    assert manifest.source_type == "native"
    assert manifest.credentials == manifest.permissions.credentials == ["stripe_key"]
    assert manifest.permissions.network == ["api.stripe.com"]
    assert manifest.permissions.filesystem == [FilesystemAccess(path="/receipts/*", access="write")]
    assert spec_of(ns["pay"]).limits == ToolLimits(memory_mb=256)
