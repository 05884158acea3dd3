"""HTML pieces of the report page: figures with their caption as alt text, collapsed sections.

The report notebook displays these as HTML outputs; nbconvert keeps them as they are, so every
figure is embedded (a data URI, no file fetched) with ``alt`` equal to its caption.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

MAX_WIDTH_PX = 1000  # the report's content width: figures scale down to it, never up


def figure(png: str | Path, caption: str, figure_id: str = "") -> str:
    """A ``<figure>``: the PNG embedded, its caption as alt text and under it."""
    data = base64.b64encode(Path(png).read_bytes()).decode()
    text = html.escape(caption, quote=True)
    ident = f' id="{html.escape(figure_id, quote=True)}"' if figure_id else ""
    return (
        f'<figure{ident} style="margin:1em 0">'
        f'<img src="data:image/png;base64,{data}" alt="{text}" '
        f'style="max-width:min(100%, {MAX_WIDTH_PX}px);height:auto">'
        f'<figcaption style="font-size:0.9em;color:#444">{text}</figcaption></figure>'
    )


def missing(png: str | Path) -> str:
    return f"<p><em>missing figure: <code>{html.escape(str(png))}</code></em></p>"


def table(df: pd.DataFrame, table_id: str) -> str:
    """An HTML table with a stable id (the page's tests and readers can find it)."""
    return df.to_html(table_id=table_id, na_rep="–", border=0, escape=True)


def details(summary: str, body: str, details_id: str = "") -> str:
    """A collapsed section: ``summary`` always shown, ``body`` (HTML) on a click."""
    ident = f' id="{html.escape(details_id, quote=True)}"' if details_id else ""
    return f"<details{ident}><summary>{html.escape(summary)}</summary>{body}</details>"


def pre(text: str, pre_id: str) -> str:
    return f"<pre id='{html.escape(pre_id, quote=True)}'>{html.escape(text)}</pre>"


def nested_notes(markdown: str, prefix: str, below: int = 2) -> str:
    """A NOTES.md shown under one of the page's headings: its headings ``below`` levels deeper,
    as HTML with ids of their own (``prefix``-title), so two studies' notes (and the page's own
    "Targets") never share an anchor, as Markdown headings named alike would."""

    def heading(match: re.Match) -> str:
        level, title = min(len(match[1]) + below, 6), match[2].strip()
        slug = re.sub(r"\W+", "-", title).strip("-")
        text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(title))
        return f'<h{level} id="{html.escape(prefix, quote=True)}-{slug}">{text}</h{level}>'

    return re.sub(r"^(#+) (.+)$", heading, markdown, flags=re.M)
