"""Generate: invent names with a trained model; every setting lives in the URL, so a link reproduces its names."""

import html
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import streamlit as st

from pages._ui import SENTENCE_MAX, backend, error_text, fmt_nll, plain, run_where, shorten, visitor_turn
from pages._run_actions import model_download_button, run_page_link
from petmodel.app.generate_view import (NAMES_KEY, SCORE_MAX_CHARS, TRAILING_SPACES, copy_link_html,
                                        name_cells)
from petmodel.app.links import (N_MAX, PREFIX_MAX, SEED_MAX, TEMPERATURE_RANGE, GenerateSettings,
                                parse_generate_params)
from petmodel.config import SPECIES
from petmodel.errors import PetmodelError
from petmodel.names import display_names

if TYPE_CHECKING:
    from streamlit.delta_generator import DeltaGenerator

    from petmodel.generate import Generated

URL_KEYS = ("model", "temperature", "n", "prefix", "seed", "new", "species")
WIDGETS = {"model": "gen_model", "temperature": "gen_temperature", "n": "gen_n", "prefix": "gen_prefix",
           "seed": "gen_seed", "new_only": "gen_new", "species": "gen_species"}
SPECIES_LABELS = {"any": "Any pet", "dog": "Dog", "cat": "Cat", "other": "Other"}
NAMES_CACHED = 512  # name lists kept for every session together (20 names are about 1 KB; 1,000 about 10 KB)

be = backend()
st.title("Generate names")
st.caption("Names come from the model one character at a time; higher temperature means bolder names. The same "
           "settings and seed always give the same names, and the page's URL holds them all.")

try:
    models = be.models()
except PetmodelError as err:
    st.error(error_text(err))
    st.stop()

# ---------------------------------------------------------------- settings: from the URL on arrival
if WIDGETS["n"] not in st.session_state:  # the page was just opened (widgets are not alive yet)
    from_url = {k: v for k, v in st.query_params.to_dict().items() if k in URL_KEYS}
    if not from_url and "gen_last" in st.session_state:
        from_url = st.session_state["gen_last"]  # back from another page: keep what the user had
    settings, notices = parse_generate_params(from_url, be.store, models=models)
    settings = settings.with_seed()
    st.session_state["gen_notices"] = notices
    st.session_state["gen_arrival"] = settings.to_query()
    for field, key in WIDGETS.items():
        st.session_state[key] = getattr(settings, field)

if not models:
    for notice in st.session_state.get("gen_notices", []):
        st.warning(plain(notice, SENTENCE_MAX), icon=":material/link_off:")  # a notice quotes the link's text
    st.info("There is no trained model yet: train one first (a one-minute run is enough for plausible names).")
    st.page_link("pages/train.py", label="Go to Train", icon=":material/model_training:")
    st.stop()

by_id = {m.id: m for m in models}
if st.session_state.get(WIDGETS["model"]) not in by_id:
    st.session_state[WIDGETS["model"]] = models[0].id


def _model_label(run_id: str) -> str:
    run = by_id[run_id]
    best = " · best" if run_id == models[0].id else ""
    name = f"{shorten(run.name)} · " if run.name else ""  # the picker shows names plain; a long one is cut
    return f"{name}NLL {fmt_nll(run.nll)} · {run_where(run)}{best} · {run_id}" if name else \
        f"{run_id} · NLL {fmt_nll(run.nll)} · {run_where(run)}{best}"


def _knows_species(run_id: str) -> bool:
    try:
        return bool(be.checkpoint(run_id).species)
    except PetmodelError:
        return False


def _pick(text: str) -> None:
    """A click on a name: the name goes into the score box; the page then reruns whole (see names_panel)."""
    st.session_state["gen_score"] = text
    st.session_state["gen_picked"] = True


def _copied() -> None:
    st.session_state["gen_copies"] = st.session_state.get("gen_copies", 0) + 1


def surprise_html(name: str, surprise: list[float], end: float) -> str:
    """The name's characters tinted by surprise (darker: the model expected it less); every character
    is HTML-escaped, so typed text never becomes markup."""
    cells = "".join(
        f'<span class="pet-char" title="{value:.1f} nats" style="background:rgba(214,80,48,{min(1.0, value / 6):.2f})">'
        f"{html.escape(ch) if ch != ' ' else '&nbsp;'}</span>" for ch, value in zip(name, surprise))
    return ("<style>.pet-char{display:inline-block;min-width:1.4rem;padding:.25rem .2rem;margin:0 1px;"
            "border-radius:.3rem;font:600 1.4rem monospace;text-align:center}</style>"
            f'<div data-testid="pet-surprise">{cells}<span class="pet-char" title="end of name: {end:.1f} nats" '
            f'style="background:rgba(214,80,48,{min(1.0, end / 6):.2f})">&#9632;</span></div>'
            "<small>Each character's surprise in nats (hover for figures); the last box is the end of the "
            "name.</small>")


def _new_seed() -> None:
    import secrets

    st.session_state[WIDGETS["seed"]] = secrets.randbelow(SEED_MAX + 1)


@st.cache_data(show_spinner=False, max_entries=NAMES_CACHED)
def _generated(store_root: str, version: float | None, settings: GenerateSettings) -> "Generated":
    """The names for ``settings``, made once per (store, model file version, settings) for every session:
    the same settings always give the same names, so a slider moved back (or a shared link opened by
    many) costs a lookup. Failures are not cached."""
    return be.generate(settings)


def _settings_form() -> bool:
    """Every setting but the temperature (whose slider sits with the names, in their fragment); a change
    here reruns the page. Their values live in st.session_state. Returns whether the model knows species."""
    with st.container(border=True):
        c1, c3 = st.columns([3.8, 1])
        c1.selectbox("Model", list(by_id), format_func=_model_label, key=WIDGETS["model"],
                     help="Completed runs whose model file exists, best first.")
        c3.number_input("Count", min_value=1, max_value=N_MAX, step=10, key=WIDGETS["n"])
        conditioned = _knows_species(st.session_state[WIDGETS["model"]])
        st.radio("Species", SPECIES, format_func=SPECIES_LABELS.get, key=WIDGETS["species"], horizontal=True,
                 disabled=not conditioned, help="Names for this kind of pet." if conditioned else
                 "This model was trained without species; train a new one to choose.")
        d1, d2, d3, d4 = st.columns([2, 1.1, 0.9, 1.4], vertical_alignment="bottom")
        d1.text_input("Prefix", key=WIDGETS["prefix"], max_chars=PREFIX_MAX, placeholder="e.g. ma",
                      help="Every name starts with this (letters, space, '.' and '-').")
        d2.number_input("Seed", min_value=0, max_value=SEED_MAX, step=1, key=WIDGETS["seed"],
                        help="Same seed and settings, same names.")
        d3.button("New seed", icon=":material/casino:", on_click=_new_seed, help="Roll a new random seed",
                  key="gen_reroll")
        d4.toggle("Only new names", key=WIDGETS["new_only"], help="Leave out names that are in the training data.")
    return conditioned


def _current_settings(conditioned: bool) -> tuple[GenerateSettings, list[str]]:
    """The widgets' settings, through the same checks as a URL (a prefix with a digit, say, is refused with a
    notice), and those notices; a species the model does not know becomes "any"."""
    raw = {"model": st.session_state[WIDGETS["model"]], "temperature": st.session_state[WIDGETS["temperature"]],
           "n": st.session_state[WIDGETS["n"]], "prefix": st.session_state[WIDGETS["prefix"]],
           "seed": st.session_state[WIDGETS["seed"]], "new": "1" if st.session_state[WIDGETS["new_only"]] else "0",
           "species": st.session_state[WIDGETS["species"]]}
    settings, problems = parse_generate_params({k: str(v) for k, v in raw.items()}, be.store, models=models)
    settings = settings.with_seed()
    return (settings if conditioned or settings.species == "any" else replace(settings, species="any")), problems


def _show_names(settings: GenerateSettings, out: "Generated", query: dict[str, str],
                heading: "DeltaGenerator") -> None:
    """The names (their count in ``heading``), their download and the link that reproduces them; a click on a
    name scores it in the box below."""
    names = out.names
    heading.subheader(f"{len(names):,} name{'s' if len(names) != 1 else ''}")
    if settings.new_only and len(names) < settings.n:
        st.caption(f"Only {len(names):,} new names turned up in {out.attempts:,} tries; lower the temperature "
                   "or drop the prefix for more.")
    text = "\n".join(display_names(names)) + "\n"
    file_name = f"pet-names-{settings.model}-seed{settings.seed}.txt"
    link = f"{st.context.url or ''}?{urlencode(query)}"
    # One row of Streamlit buttons above the names: the names as a file, the link that reproduces them, and for
    # the owner the model and its run; after a click on "Copy link", the row's end says whether it was copied.
    with st.container(horizontal=True, vertical_alignment="center", gap="small", key="gen_actions"):
        st.download_button("Download names", text.encode("utf-8"), file_name=file_name, mime="text/plain",
                           icon=":material/download:", key="gen_download", on_click="ignore")
        copy = st.button("Copy link", icon=":material/link:", key="gen_copy", on_click=_copied,
                         help="The page's address with every setting: it reproduces exactly these names.")
        model_download_button(be, settings.model, key="gen_model_download")  # the owner only (as the link)
        run_page_link(settings.model)
        if copy:
            st.html(copy_link_html(link, st.session_state.get("gen_copies", 0)), unsafe_allow_javascript=True)
    st.caption("Click a name to score it below.")
    with st.container(horizontal=True, gap="small", key=NAMES_KEY):  # rows that wrap, each filled edge to edge
        for cell in name_cells(names):
            st.button(cell.label, key=cell.key, on_click=_pick, args=(cell.text,), width="stretch")
        for _ in range(TRAILING_SPACES):
            st.space("stretch")


def _score_box(settings: GenerateSettings) -> None:
    """How pet-like a typed name is to the chosen model, for the chosen species."""
    st.divider()
    st.subheader("Score a name")
    kind = "" if settings.species == "any" else f"{settings.species} "
    st.caption(f"How pet-like is a name to this model? Lower NLL per character is more pet-like; the percentile "
               f"compares it with real {kind}names the model never trained on.")
    typed = st.text_input("Score a name", key="gen_score", max_chars=SCORE_MAX_CHARS, placeholder="e.g. bella",
                          label_visibility="collapsed")
    if typed.strip():
        try:
            scored = be.score(settings.model, [typed], settings.species)[0]
        except PetmodelError as err:
            st.error(error_text(err))
        else:
            m1, m2 = st.columns(2)
            m1.metric("NLL per character", f"{scored.nll:.2f} nats")
            m2.metric("More pet-like than", "—" if scored.percentile is None
                      else f"{scored.percentile:.0f}% of real {kind}names")
            st.markdown(surprise_html(scored.name, scored.surprise, scored.end_surprise), unsafe_allow_html=True)


@st.fragment
def names_panel(conditioned: bool) -> None:
    """The temperature slider and the names: moving the slider reruns only this fragment (not the page with
    its sidebar, model list, store queries, other widgets and score box), so a move costs one sampling of
    names, or a cached lookup. Other settings rerun the page, this included."""
    if st.session_state.pop("gen_picked", False):  # a name was clicked: the score box, outside, shows it
        st.rerun(scope="app")
    settings, problems = _current_settings(conditioned)
    if settings.species != st.session_state[WIDGETS["species"]]:  # e.g. a cat link, a model without species
        st.info(f"This model was trained without species, so these are names for any pet, not only "
                f"{st.session_state[WIDGETS['species']]}s.", icon=":material/pets:")
    if settings.to_query() == st.session_state.get("gen_arrival"):  # notices about the link, until the user moves on
        for notice in st.session_state.get("gen_notices", []):
            st.warning(plain(notice, SENTENCE_MAX), icon=":material/link_off:")  # a notice quotes the link's text
    for problem in problems:
        st.error(plain(problem, SENTENCE_MAX))
    st.session_state["gen_last"] = query = settings.to_query()
    if st.query_params.to_dict() != query:  # every setting in the URL: the address bar reproduces this view
        st.query_params.from_dict(query)

    heading, control = st.columns([1.4, 1], vertical_alignment="bottom")
    control.slider("Temperature", min_value=TEMPERATURE_RANGE[0], max_value=TEMPERATURE_RANGE[1], step=0.01,
                   key=WIDGETS["temperature"], help="Low: safe, common names. High: adventurous ones.")
    try:
        with visitor_turn(settings.n):  # making and drawing many names is a visitor's heavy work: one at a time
            out = _generated(str(be.store.root), be.model_version(settings.model), settings)
            _show_names(settings, out, query, heading)
    except PetmodelError as err:  # a damaged model file (visitors read it without the server path), a busy server
        st.warning(error_text(err))
        st.stop()


conditioned = _settings_form()
names_panel(conditioned)
_score_box(_current_settings(conditioned)[0])
