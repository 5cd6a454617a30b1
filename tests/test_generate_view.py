"""petmodel.app.generate_view: the Generate page's names as buttons and its "Copy link" script (pure, no Streamlit)."""

from __future__ import annotations

import html
import re

from petmodel.app.generate_view import COPIED, NAME_KEY_PREFIX, SCORE_MAX_CHARS, copy_link_html, name_cells
from petmodel.names import display_name


def test_every_name_is_a_button_that_reads_as_shown_and_fills_the_score_box_with_it():
    names = ["bella", "mr. whiskers", "- odd", "bella", "x" * 70]
    cells = name_cells(names)
    assert [c.key for c in cells] == [f"{NAME_KEY_PREFIX}{i}" for i in range(5)]  # equal names, two buttons
    assert [c.text for c in cells[:4]] == ["Bella", "Mr. Whiskers", "- Odd", "Bella"]
    assert cells[0].label == "Bella" and cells[1].label == "Mr. Whiskers"
    assert cells[2].label == "\\- Odd"  # a leading "-" would be a list item in the button's Markdown
    assert re.sub(r"\\(.)", r"\1", cells[2].label) == display_name("- odd")
    assert len(cells[4].text) == SCORE_MAX_CHARS  # what the score box takes
    assert name_cells([]) == []


def test_the_copy_script_carries_the_link_escaped_and_differs_on_every_click():
    link = 'http://host:8501/generate?model=x&prefix=a"><script>alert(1)</script>'
    first, second = copy_link_html(link, 1), copy_link_html(link, 2)
    assert first != second and 'data-nonce="2"' in second
    assert f'data-link="{html.escape(link, quote=True)}"' in first
    assert first.count("<script") == 1 and first.count('">') == 1  # the link's tags and quotes are text
    assert COPIED in first and 'span.pet-copy-status[data-nonce="1"]' in first
