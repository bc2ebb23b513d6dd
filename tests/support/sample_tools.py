"""Tools the tests load through ``TOOLFLEET_TOOL_MODULES`` (as a user's module would be)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel

from toolfleet.errors import ExternalApiError, ToolExecutionError
from toolfleet.sdk import (
    Breaker,
    Cache,
    Resilience,
    Retry,
    Sandbox,
    ToolContext,
    ToolPermissions,
    tool,
)

# These tools run in the executor's loop: they count runs in this process (RUNS), which
# the tests read.
TOOLFLEET_ISOLATION = "none"


class Empty(BaseModel):
    pass


class Anything(BaseModel):
    value: int


@tool(id="test__wrong_output", version="1.0.0", effect="read_only", redaction_allowlist=["value"])
async def wrong_output(params: Empty, ctx: ToolContext) -> Anything:
    """Returns a result that breaks its own output schema."""
    bad: Any = {"value": "not a number"}
    return bad  # type: ignore[no-any-return]


@tool(id="test__boom", version="1.0.0", effect="read_only", redaction_allowlist=["value"])
async def boom(params: Empty, ctx: ToolContext) -> Anything:
    """Raises with a message that must never leave the executor."""
    raise RuntimeError("database password is hunter2")


class Profile(BaseModel):
    name: str
    email: str
    ssn: str


class ProfileOut(BaseModel):
    profile: Profile
    score: int


@tool(
    id="test__profile",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["profile.name", "score"],
)
async def profile(params: Empty, ctx: ToolContext) -> ProfileOut:
    """Returns fields that the allowlist only partly lets through."""
    return ProfileOut(
        profile=Profile(name="Ada", email="ada@example.com", ssn="123-45-6789"), score=7
    )


class SleepIn(BaseModel):
    seconds: float


@tool(
    id="test__sleep",
    version="1.0.0",
    effect="external_side_effect",
    redaction_allowlist=["value"],
    timeout_seconds=1,
)
async def sleep(params: SleepIn, ctx: ToolContext) -> Anything:
    """Sleeps; its one-second timeout makes long sleeps time out."""
    await asyncio.sleep(params.seconds)
    return Anything(value=1)


@tool(id="test__versioned", version="1.0.0", effect="read_only", redaction_allowlist=["value"])
async def versioned_1(params: Empty, ctx: ToolContext) -> Anything:
    return Anything(value=1)


@tool(id="test__versioned", version="1.5.0", effect="read_only", redaction_allowlist=["value"])
async def versioned_15(params: Empty, ctx: ToolContext) -> Anything:
    return Anything(value=15)


@tool(id="test__versioned", version="2.0.0", effect="read_only", redaction_allowlist=["value"])
async def versioned_2(params: Empty, ctx: ToolContext) -> Anything:
    return Anything(value=2)


class Fingerprint(BaseModel):
    fingerprint: str
    length: int


@tool(
    id="test__secret_user",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["fingerprint", "length"],
    sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key"])),
)
async def secret_user(params: Empty, ctx: ToolContext) -> Fingerprint:
    """Uses its credential and returns something derived from it, never the value."""
    key = ctx.credential("api_key")
    digest = hashlib.sha256(key.reveal().encode()).hexdigest()
    return Fingerprint(fingerprint=digest[:12], length=len(key))


class LeakIn(BaseModel):
    how: Literal["raw", "base64", "error", "checkpoint"] = "raw"


class Leak(BaseModel):
    value: str


@tool(
    id="test__secret_leaker",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["value"],
    sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key"])),
)
async def secret_leaker(params: LeakIn, ctx: ToolContext) -> Leak:
    """Tries to get its credential out: result, base64, error message or checkpoint."""
    raw = ctx.credential("api_key").reveal()
    if params.how == "error":
        raise ExternalApiError(f"upstream rejected key {raw}")
    if params.how == "checkpoint":
        await ctx.checkpoint({"key": raw}, progress_percent=50)
        return Leak(value="checkpointed")
    if params.how == "base64":
        return Leak(value="token=" + base64.b64encode(f"user:{raw}".encode()).decode())
    return Leak(value=f"the key is {raw}")


#: Runs per key (invocation id, or a test's own key), in this process: the in-process
#: fleet runs these tools here, so tests read the counts directly.
RUNS: Counter[str] = Counter()


class FlakyIn(BaseModel):
    fail_times: int


class FlakyOut(BaseModel):
    attempt: int
    resumed_from_attempt: int | None


@tool(
    id="test__flaky",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["attempt", "resumed_from_attempt"],
    resilience=Resilience(
        retry=Retry(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05),
        # Its failures are the point of the retry tests: a circuit that never opens.
        circuit=Breaker(name="test.flaky", window_size=100, minimum_calls=100, failure_rate=1.0),
    ),
)
async def flaky(params: FlakyIn, ctx: ToolContext) -> FlakyOut:
    """Fails its first ``fail_times`` runs of an invocation, checkpointing each."""
    RUNS[f"flaky:{ctx.invocation_id}"] += 1
    state = ctx.resume_state()
    await ctx.checkpoint({"attempt": ctx.attempt}, progress_percent=50)
    if RUNS[f"flaky:{ctx.invocation_id}"] <= params.fail_times:
        raise ExternalApiError("upstream answered 503")
    return FlakyOut(attempt=ctx.attempt, resumed_from_attempt=state["attempt"] if state else None)


@tool(
    id="test__fatal",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["value"],
    resilience=Resilience(
        retry=Retry(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05),
        circuit=Breaker(name="test.fatal"),
    ),
)
async def fatal(params: Empty, ctx: ToolContext) -> Anything:
    """Fails with an error no retry can fix."""
    RUNS[f"fatal:{ctx.invocation_id}"] += 1
    raise ToolExecutionError("the request itself is wrong")


class BreakerIn(BaseModel):
    fail: bool


@tool(
    id="test__breaker",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["value"],
    resilience=Resilience(
        circuit=Breaker(
            name="test.breaker",
            window_size=4,
            minimum_calls=3,
            failure_rate=0.5,
            open_s=2.0,
            half_open_calls=2,
        )
    ),
)
async def breaker(params: BreakerIn, ctx: ToolContext) -> Anything:
    """Fails with an upstream error when asked to: drives its small circuit breaker."""
    if params.fail:
        raise ExternalApiError("upstream is down")
    return Anything(value=1)


class CachedIn(BaseModel):
    key: str


@tool(
    id="test__cached",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["value"],
    resilience=Resilience(cache=Cache(mode="ttl", ttl_s=60)),
)
async def cached(params: CachedIn, ctx: ToolContext) -> Anything:
    """Counts how often it really ran for ``key``."""
    RUNS[f"cached:{params.key}"] += 1
    return Anything(value=RUNS[f"cached:{params.key}"])


#: Labels of ``test__ordered`` calls in the order they started, per test run key.
STARTED: dict[str, list[str]] = {}
#: Gates by name; a ``test__ordered`` call with a gate runs until the test sets it.
GATES: dict[str, asyncio.Event] = {}


def gate(name: str) -> asyncio.Event:
    return GATES.setdefault(name, asyncio.Event())


class OrderedIn(BaseModel):
    run: str
    label: str
    gate: str | None = None


@tool(
    id="test__ordered",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["value"],
    timeout_seconds=60,
)
async def ordered(params: OrderedIn, ctx: ToolContext) -> Anything:
    """Records when it started (scheduling order), then holds until its gate opens."""
    STARTED.setdefault(params.run, []).append(params.label)
    if params.gate is not None:
        await gate(params.gate).wait()
    return Anything(value=len(STARTED[params.run]))


class CheckpointerIn(BaseModel):
    steps: int = 3
    names: dict[int, str] = {}
    """Step number → name of a named checkpoint at that step."""
    rows: int = 0
    """Rows of padding in the state (makes it big enough for delta encoding)."""


class CheckpointerOut(BaseModel):
    resumed_step: int | None
    resumed_marker: str | None
    checkpoint_ids: list[str]


@tool(
    id="test__checkpointer",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["resumed_step", "resumed_marker", "checkpoint_ids"],
)
async def checkpointer(params: CheckpointerIn, ctx: ToolContext) -> CheckpointerOut:
    """Checkpoints once per step (named where asked), after the step it resumed from."""
    resumed = ctx.resume_state()
    first = resumed["step"] + 1 if resumed else 1
    rows = (
        resumed["rows"]
        if resumed
        else [{"n": i, "text": f"row {i} " * 4} for i in range(params.rows)]
    )
    ids: list[str] = []
    for step in range(first, params.steps + 1):
        if rows:
            rows[step % len(rows)]["text"] = f"step {step}"
        state = {"step": step, "marker": f"run {ctx.invocation_id} step {step}", "rows": rows}
        checkpoint_id = await ctx.checkpoint(
            state, progress_percent=100 * step / params.steps, name=params.names.get(step)
        )
        if checkpoint_id is not None:
            ids.append(checkpoint_id)
    return CheckpointerOut(
        resumed_step=resumed["step"] if resumed else None,
        resumed_marker=resumed.get("marker") if resumed else None,
        checkpoint_ids=ids,
    )


@tool(
    id="test__windowed",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["value"],
    resilience=Resilience(
        circuit=Breaker(
            name="test.windowed",
            window="time",
            window_s=3.0,
            minimum_calls=2,
            failure_rate=0.5,
            open_s=3.0,
            half_open_calls=2,
            half_open_strategy="canary",
        )
    ),
)
async def windowed(params: BreakerIn, ctx: ToolContext) -> Anything:
    """Like ``test__breaker``, under a time window and canary half-open trials."""
    if params.fail:
        raise ExternalApiError("upstream is down")
    return Anything(value=1)


class BigIn(BaseModel):
    rows: int
    text_bytes: int = 100


class BigRow(BaseModel):
    index: int
    text: str
    secret: str


class BigOut(BaseModel):
    rows: list[BigRow]
    total: int


@tool(
    id="test__big_output",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["rows.index", "rows.text", "total"],
)
async def big_output(params: BigIn, ctx: ToolContext) -> BigOut:
    """``rows`` rows of ``text_bytes`` characters each, plus a field clients never see."""
    return BigOut(
        rows=[
            BigRow(index=i, text=f"{i:08d}".ljust(params.text_bytes, "x"), secret=f"s3cr3t-{i}")
            for i in range(params.rows)
        ],
        total=params.rows,
    )


class ReadDocumentInput(BaseModel):
    document_id: str
    steps: int = 0
    step_seconds: float = 0.0


class ReadDocumentOutput(BaseModel):
    versions_seen: list[str]
    content: str
    resumed_from_step: int | None = None


@tool(
    id="test__read_document",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["versions_seen", "content", "resumed_from_step"],
    timeout_seconds=600,
)
async def read_document(params: ReadDocumentInput, ctx: ToolContext) -> ReadDocumentOutput:
    """Reads a document through ``ctx.documents`` at the start and after every step,
    checkpointing the versions it saw (a long call reading its source of truth)."""
    state = ctx.resume_state()
    start = int(state["step"]) if state else 0
    seen: list[str] = list(state["seen"]) if state else []
    doc = await ctx.documents.get(params.document_id)
    seen.append(doc.version)
    for step in range(start, params.steps):
        await asyncio.sleep(params.step_seconds)
        doc = await ctx.documents.get(params.document_id)
        seen.append(doc.version)
        done = step + 1
        await ctx.checkpoint(
            {"step": done, "seen": seen}, progress_percent=100.0 * done / params.steps
        )
    return ReadDocumentOutput(
        versions_seen=seen, content=doc.content, resumed_from_step=start if state else None
    )
