"""What a document source answers with (pure pydantic, no I/O)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Document(_Answer):
    """One version of one document: ``get_source_of_truth``'s answer."""

    document_id: str
    version: str
    """The version this content is (a source names versions as it likes)."""
    title: str = ""
    content: str
    content_type: str = "text/plain"


class DocumentMetadata(_Answer):
    """``get_document_metadata``'s answer: what the source knows of a document."""

    document_id: str
    title: str = ""
    latest_version: str
    """The version a read without a pin gets now."""
    versions: list[str] = Field(default_factory=list)
    """Every version the source still serves, oldest first."""
    updated_at: str | None = None


class SearchHit(_Answer):
    """One result of ``search_documents`` or ``find_overlaps``."""

    document_id: str
    version: str
    title: str = ""
    snippet: str = ""
    score: float = 0.0
