"""What the Generate page shows, apart from Streamlit: its names as buttons, and its "Copy link" script.

Pure (no Streamlit): the page lays these out with Streamlit's own widgets (a wrapping horizontal
``st.container`` of ``st.button``), so the names, the download and the copy button share Streamlit's look.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from petmodel.app.plain_text import plain
from petmodel.names import display_name

NAME_KEY_PREFIX = "gen_name_"  # the names' buttons: gen_name_0, gen_name_1, …
SCORE_MAX_CHARS = 64  # the score box's limit
NAMES_KEY = "gen_names"  # the names' container (Streamlit gives it the CSS class st-key-gen_names)
# Names fill their rows edge to edge (st.button width="stretch" in a wrapping row); this many stretching spaces
# after the last name (they share a short last row with its names) keep one name from spanning the page.
TRAILING_SPACES = 4
COPIED = "Link copied: it reproduces exactly these names."
NOT_COPIED = "Could not copy; copy the address bar."


@dataclass(frozen=True)
class NameCell:
    """One name on the page: its button's key, its label (the name as shown, safe as Markdown) and the text a
    click puts in the score box (the name as shown)."""

    key: str
    label: str
    text: str


def name_cells(names: list[str]) -> list[NameCell]:
    """``names`` (the model's spelling) as the page's buttons, in order.

    A name reads as :func:`petmodel.names.display_name` shows it everywhere (its label only escapes what
    Markdown would act on, such as a leading "-"). Keys go by position, so two equal names (possible without
    "only new names") are two buttons."""
    return [NameCell(f"{NAME_KEY_PREFIX}{i}", plain(display_name(name), None), display_name(name)[:SCORE_MAX_CHARS])
            for i, name in enumerate(names)]


_COPY_SCRIPT = """<script>
(async () => {
  const s = document.querySelector('span.pet-copy-status[data-nonce="%d"]');
  if (!s) return;
  const link = s.dataset.link;
  let ok = false;
  try { await navigator.clipboard.writeText(link); ok = true; } catch (e) {
    const t = document.createElement("textarea");
    t.value = link; t.setAttribute("readonly", ""); t.style.position = "fixed"; t.style.opacity = "0";
    document.body.appendChild(t); t.select();
    try { ok = document.execCommand("copy"); } catch (e2) {}
    t.remove();
  }
  s.textContent = ok ? %s : %s;
})();
</script>"""


def copy_link_html(link: str, nonce: int) -> str:
    """HTML for ``st.html(..., unsafe_allow_javascript=True)``, drawn on the run that follows a click on the page's
    own "Copy link" button (a Streamlit button: Streamlit has no clipboard widget): it puts ``link`` on the
    clipboard and says whether that worked, in a status line beside the button.

    The HTML and script are ours; the one outside value, the link, travels HTML-escaped in a data attribute,
    never inside the script. ``nonce`` (a whole number, new on every click) makes each click's HTML differ, so
    Streamlit runs the script again on a second click.
    """
    nonce = int(nonce)
    return (f'<span class="pet-copy-status" role="status" data-nonce="{nonce}" '
            f'data-link="{html.escape(link, quote=True)}" style="color:#2e7d32;font-size:.9rem"></span>'
            + _COPY_SCRIPT % (nonce, _js_string(COPIED), _js_string(NOT_COPIED)))


def _js_string(text: str) -> str:
    """A constant of ours as a JavaScript string literal (double quotes; none of ours holds a quote or backslash)."""
    assert '"' not in text and "\\" not in text and "<" not in text
    return f'"{text}"'
