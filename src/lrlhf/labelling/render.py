"""What the labelling page shows of a text: exactly its characters.

People label what they see, so no markup may hide, join or add a character: a markdown renderer joins single line
breaks, decodes escapes and entities (``\\"`` and ``&amp;`` look like ``"`` and ``&``), hides link targets and
reference definitions, turns ``---`` under a line into a heading and ``*a*`` into italics. Here every character of
the text is in the page's text, in order (HTML-escaped, so nothing in an answer is markup): prose keeps its line
breaks and spaces (``white-space: pre-wrap``), and a fenced code block (a line opening with three backticks or
tildes, up to its closing fence, fences included) is set in a monospace box that scrolls sideways. The raw view
(:func:`raw_html`) shows the text as its JSON string, escapes and all, as the file holds it.
"""

from __future__ import annotations

import json
import re
from html import escape

FENCE = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})")


def _blocks(text: str) -> list[tuple[str, str]]:
    """``text`` cut into ("prose" | "code", part) in order; the parts joined are ``text`` exactly."""
    blocks: list[tuple[str, str]] = []
    lines = text.splitlines(keepends=True)
    i, prose = 0, []
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            prose.append(lines[i])
            i += 1
            continue
        fence = opening.group(1)
        end = next((j for j in range(i + 1, len(lines))
                    if lines[j].strip().startswith(fence[0] * len(fence)) and not lines[j].strip().strip(fence[0])),
                   len(lines) - 1)
        if prose:
            blocks.append(("prose", "".join(prose)))
            prose = []
        blocks.append(("code", "".join(lines[i:end + 1])))
        i = end + 1
    if prose:
        blocks.append(("prose", "".join(prose)))
    return blocks


def text_html(text: str) -> str:
    """``text`` as HTML whose text content is ``text`` exactly (see the module docstring); every character of
    ``text`` escaped, so the page may insert it as it is."""
    parts = [f'<pre class="code">{escape(part)}</pre>' if kind == "code"
             else f'<span class="prose">{escape(part)}</span>' for kind, part in _blocks(text)]
    return "".join(parts)


def raw_html(text: str) -> str:
    """``text`` as the JSON string a file holds (escapes, quotes and non-printing characters visible)."""
    return f'<pre class="raw">{escape(json.dumps(text, ensure_ascii=False))}</pre>'


__all__ = ["raw_html", "text_html"]
