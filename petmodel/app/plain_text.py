"""User text on a page, shown as typed: never as Markdown, never as long as it came.

Nearly every Streamlit text element renders Markdown, with Streamlit's extensions: links and bare
URLs, images (which the browser fetches), ``:red[…]`` colours, ``:material/…:`` icons, emoji
shortcodes, ``$…$`` maths. Text that users chose (a link's parameters, run and study names, rows
of a data file, error sentences that quote them) must not format the page, link elsewhere or
make the browser fetch anything, so it goes through :func:`plain` before it is put into Markdown.

Only what Markdown would act on is escaped, so the text stays readable in the page's source:
``names.csv``, ``private-folder``, ``run_2`` and ``tcp://host:8786`` pass unchanged. Syntax
(``[a](b)``, ``*x*``, ``<b>``, ``$x$``, ``:red[x]``) gets a backslash, which CommonMark allows
before any ASCII punctuation. Bare URLs, ``www.`` addresses, e-mail addresses and ``:shortcode:`` emoji and icons
are found in the text *after* escapes are resolved (checked in Chromium with Streamlit 1.67: a
backslash does not stop them), so a word joiner (U+2060, invisible) breaks those patterns.

Control and format characters (a right-to-left override can make a name read backwards) are
dropped and whitespace is collapsed, so a name is one line. :func:`shorten` cuts long text with an
ellipsis: a 10,000-character run name must not make a page thousands of pixels tall. Pure: no
Streamlit.
"""

from __future__ import annotations

import re
import unicodedata

DISPLAY_MAX = 60  # characters of a name shown in headings and pickers (the full name is in the store)
SENTENCE_MAX = 600  # characters of an error sentence shown: one sentence, never a flood

_ALWAYS = frozenset("\\`*[]<>~$&|")  # Markdown syntax anywhere in a line: backslash-escaped
_LINE_START = re.compile(r"^(?:[#+\-=]|\d+(?=[.)]))")  # a heading, a list item, a numbered item
_WWW = re.compile(r"(?i)(www)\.")  # a bare www. address becomes a link
_WEB_SCHEME = re.compile(r"(?i)https?$")  # the only schemes Markdown links bare: tcp://host:8786 stays as it is
JOINER = "\u2060"  # WORD JOINER: invisible; it breaks "https://", "www.", "a@b.c" and ":smile:" apart


def one_line(text: object) -> str:
    """``text`` as one line: control and format characters dropped, runs of whitespace one space."""
    kept = "".join(" " if ch.isspace() else ch for ch in str(text)
                   if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf"))
    return " ".join(kept.split())


def shorten(text: object, limit: int | None = DISPLAY_MAX) -> str:
    """``text`` as one line of at most ``limit`` characters, cut with an ellipsis (None: any length)."""
    line = one_line(text)
    if limit is None or len(line) <= limit:
        return line
    return line[: max(0, limit - 1)].rstrip() + "…"


def escape_markdown(text: object) -> str:
    """``text`` (made one line) with Markdown's syntax backslash-escaped and its text patterns broken."""
    line = one_line(text)
    out = []
    for i, ch in enumerate(line):
        before = line[i - 1] if i else ""
        after = line[i + 1] if i + 1 < len(line) else ""
        if ch in _ALWAYS:
            out.append("\\" + ch)
        elif ch == "_" and not (before.isalnum() and after.isalnum()):  # run_2 stays; _x_ would be italic
            out.append("\\_")
        elif ch == ":" and (after.isalpha() or after in ("+", "-")  # :red[…], :smile:, :+1:
                            or line.startswith("//", i + 1) and _WEB_SCHEME.search(line, 0, i)):  # https://
            out.append("\\:" + JOINER)
        elif ch == "@":  # an e-mail address becomes a mailto: link
            out.append(JOINER + "@")
        else:
            out.append(ch)
    escaped = _WWW.sub(r"\1" + JOINER + ".", "".join(out))
    match = _LINE_START.match(escaped)
    if match is None:
        return escaped
    if match.group(0).isdigit():  # "1. x" or "1) x": escape the dot or bracket after the number
        end = match.end()
        return escaped[:end] + "\\" + escaped[end:]
    return "\\" + escaped


def plain(text: object, limit: int | None = DISPLAY_MAX) -> str:
    """User text for Markdown, shown as typed: cut to ``limit`` characters (None: whole), then escaped."""
    return escape_markdown(shorten(text, limit))
