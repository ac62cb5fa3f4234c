"""The console's page and its static files (handlers/console/static/, shipped in the
wheel). Static: they hold no data and no secret, so they are served without a token;
everything shown comes from the API with the token the user gives.

The token is read from the URL fragment (``#token=...``, which browsers never send to a
server) or typed in, and kept per env in sessionStorage. The live tail is read with
fetch(), not EventSource, because EventSource cannot send an Authorization header. The
charts are uPlot (MIT, vendored under static/vendor/uplot/ with its licence): nothing is
fetched from elsewhere, the console runs without internet.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Sequence
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"


@functools.cache
def _template() -> str:
    return (STATIC / "index.html").read_text("utf-8")


def index_html(home: str, topics: Sequence[str]) -> str:
    options = "".join(f'<option value="{html.escape(t)}">{html.escape(t)}</option>' for t in topics)
    return _template().replace("__HOME__", html.escape(home)).replace("__TOPICS__", options)


__all__ = ["STATIC", "index_html"]
