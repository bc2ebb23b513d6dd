"""What the API's responses share: JSON that survives every string Python can hold, and
the pieces of its Server-Sent Event streams (:data:`EVENT_STREAM`, :func:`sse_frame`,
the keep-alive).

Starlette's ``JSONResponse`` writes UTF-8 without ASCII escapes, which fails on a lone
UTF-16 surrogate: a JSON request or event may carry ``"\\ud800"``, the status projection
stores it losslessly, and reading it back must not be a 500. Such a body is written
with ASCII escapes instead (``"\\ud800"`` again, as it arrived); any other body is
written exactly as before.
"""

from __future__ import annotations

import json
from typing import Any, Final

from fastapi.responses import JSONResponse


class SafeJSONResponse(JSONResponse):
    """``JSONResponse`` that escapes lone surrogates rather than failing on them."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(
                content, ensure_ascii=True, allow_nan=False, indent=None, separators=(",", ":")
            ).encode("ascii")


EVENT_STREAM: dict[int | str, dict[str, Any]] = {
    200: {"description": "Server-Sent Events", "content": {"text/event-stream": {}}}
}
"""The OpenAPI ``responses`` entry of a route answering with a Server-Sent Events stream."""
KEEPALIVE_S: Final = 15.0
"""An event stream writes a comment line at least this often, so proxies keep it open."""
KEEPALIVE: Final = ": keep-alive\n\n"
"""That comment line."""


def sse_frame(number: int, event: str, data: str) -> str:
    """One Server-Sent Event: its ``id``, its ``event`` name and ``data`` (one line of
    JSON text)."""
    return f"id: {number}\nevent: {event}\ndata: {data}\n\n"
