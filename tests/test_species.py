"""Species: the corpus carries them, the model is conditioned on them, names are generated and scored by them.

One short training (module fixture, a few seconds) serves every test here. Its seed is fixed: the
effect being tested is small (about 0.01 nats per character on held-out names), so a fixed seed
keeps the test deterministic rather than a coin flip on a loaded machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from petmodel.app.generate_view import NAME_KEY_PREFIX
from petmodel.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from petmodel.cli import main
from petmodel.config import SPECIES, GenerateConfig, ModelConfig, RunSpec, TrainConfig
from petmodel.data import build_corpus, is_validation, load_corpus
from petmodel.errors import PetmodelError, UsageError
from petmodel.generate import generate
from petmodel.model import CharLSTM
from petmodel.score import Scorer, token_surprises
from petmodel.store import RunStore
from petmodel.batches import SPECIES_ANY_RATE, epoch_species
from petmodel.train import train_model


@pytest.fixture(scope="module")
def species_run(tmp_path_factory, corpus):
    """A species-conditioned model trained in-process for 1,000 steps (seed 0), in a store of its own."""
    from petmodel.runner import train_in_process

    root = tmp_path_factory.mktemp("species-store")
    spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=1000, batch_size=64, lr=0.01, seed=0),
                   hidden=128, dropout=0.0, data=str(corpus.source))
    result = train_in_process(spec, RunStore(root), corpus=corpus)
    return root, result["run_id"], load_checkpoint(result["model_path"])


def run_cli(capsys, *argv: str) -> tuple[int, dict | str, str]:
    """Exit code, the JSON object (with --json) or the printed text, and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]) if code == 0 and "--json" in argv else out, err


# --------------------------------------------------------------------------- the data
def test_the_corpus_keeps_distinct_name_species_pairs(corpus):
    assert corpus.has_species
    pairs = set(corpus.train_pairs)
    assert len(pairs) == len(corpus.train_pairs) > len(corpus.train_names)
    assert {n for n, _ in pairs} == set(corpus.train_names)  # the same names; some twice (a cat and a dog)
    assert ("bella", "cat") in pairs and ("bella", "dog") in pairs
    assert {g for _, g in pairs} == {"dog", "cat", "other"}
    # Validation is unchanged: each distinct held-out name once, with its most common species.
    assert len(corpus.val_species) == len(corpus.val_names) and all(is_validation(n) for n in corpus.val_names)
    assert corpus.val_names == sorted(set(corpus.val_names))
    train, val = corpus.encode_splits()
    assert len(train) == len(corpus.train_pairs) and len(val) == len(corpus.val_names)
    assert train.species.tolist()[:3] == [SPECIES.index(g) for _, g in corpus.train_pairs[:3]]
    counts = corpus.species_counts()
    assert counts["dog"] > counts["cat"] > counts["other"] > 0
    # One row of each: "luna" licensed twice as a cat, once as a dog, is a cat in validation.
    names = ["Luna", "Luna", "luna", "Rex"] + [f"name{chr(97 + i)}{chr(97 + j)}" for i in range(8) for j in range(8)]
    kinds = ["Cat", "Cat", "Dog", "Dog"] + ["Dog"] * 64
    small = build_corpus(names, source="t", raw_species=kinds)
    if "luna" in small.val_names:
        assert small.val_species[small.val_names.index("luna")] == "cat"
    else:
        assert ("luna", "cat") in small.train_pairs and ("luna", "dog") in small.train_pairs


def test_data_without_species_trains_the_model_of_before(tmp_path: Path, corpus):
    path = tmp_path / "names.txt"
    path.write_text("\n".join(corpus.train_names[:400] + corpus.val_names[:60]))
    plain = load_corpus(path)
    assert not plain.has_species and plain.species_counts() == {}
    train, val = plain.encode_splits()
    assert train.species is None and val.species is None
    spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=3, batch_size=16), hidden=16)
    assert spec.model_config(30).species == len(SPECIES)
    result = train_model(spec.model_config(30), spec.train, train, val)
    torch.manual_seed(0)
    before = CharLSTM(ModelConfig(hidden=16)).state_dict()
    assert result.best_state.keys() == before.keys()  # no species layer: exactly the unconditioned model
    off = RunSpec(species=False)
    assert off.model_config(30).species == 0 and off.model_config(30).for_data(True).species == 0
    with pytest.raises(UsageError, match="species must be true or false"):
        RunSpec(species="yes")


def test_any_replacement_is_seeded_and_at_the_rate():
    species = torch.randint(1, 4, (20_000,))
    a, b = epoch_species(species, seed=3, epoch=1), epoch_species(species, seed=3, epoch=1)
    assert torch.equal(a, b) and not torch.equal(a, epoch_species(species, seed=3, epoch=2))
    replaced = (a == 0).float().mean().item()
    assert abs(replaced - SPECIES_ANY_RATE) < 0.01
    assert torch.equal(a[a != 0], species[a != 0])  # the others keep their own species


# --------------------------------------------------------------------------- the model
def test_species_change_the_names(species_run, capsys):
    root, run_id, ckpt = species_run
    assert ckpt.species == SPECIES and ckpt.meta["species"]["cat"] > 5000
    cat = generate(ckpt, GenerateConfig(n=30, seed=11, species="cat")).names
    dog = generate(ckpt, GenerateConfig(n=30, seed=11, species="dog")).names
    assert cat == generate(ckpt, GenerateConfig(n=30, seed=11, species="cat")).names
    assert cat != dog and sum(c != d for c, d in zip(cat, dog)) >= 5
    code, out, _ = run_cli(capsys, "generate", "--model", run_id, "--store", str(root), "--species", "cat",
                           "-n", "30", "--seed", "11", "--json")
    assert code == 0 and out["names"] == cat and out["species"] == "cat"
    with pytest.raises(UsageError, match="Species must be one of"):
        GenerateConfig(species="horse")


def test_held_out_cat_names_score_better_as_cats_and_dog_names_as_dogs(species_run, corpus):
    _, _, ckpt = species_run
    model = ckpt.build_model()

    def nll(group: str, species: str) -> float:
        names = [n for n, s in zip(corpus.val_names, corpus.val_species) if s == group]
        values = token_surprises(model, ckpt.alphabet, names, ckpt.species_id(species))
        return sum(map(sum, values)) / sum(map(len, values))

    assert nll("cat", "cat") < nll("cat", "dog")
    assert nll("dog", "dog") < nll("dog", "cat")


def test_score_ranks_a_real_name_above_a_random_string(species_run, capsys):
    root, run_id, _ = species_run
    code, out, _ = run_cli(capsys, "score", "bella", "Xqzvvk", "--model", run_id, "--store", str(root),
                           "--species", "cat", "--json")
    assert code == 0
    bella, junk = out["scores"]
    assert bella["name"] == "bella" and junk["name"] == "xqzvvk"
    assert bella["nll"] < 2.3 < 4.0 < junk["nll"]
    assert bella["percentile"] > 80 > 5 > junk["percentile"]
    assert len(bella["surprise"]) == 5 and len(junk["surprise"]) == 6
    assert max(junk["surprise"]) > max(bella["surprise"])
    code, _, err = run_cli(capsys, "score", "b3lla", "--model", run_id, "--store", str(root))
    assert code == 1 and "'3'" in err and "not in the alphabet" in err and len(err.strip().splitlines()) == 1
    code, text, _ = run_cli(capsys, "score", "bella", "--model", run_id, "--store", str(root))
    assert code == 0 and text.startswith("Bella: NLL ") and "more pet-like than" in text and "B:" in text


def test_scorer_percentile_is_against_the_validation_names(species_run, corpus):
    _, _, ckpt = species_run
    scorer = Scorer(ckpt, corpus)
    reference = scorer.reference("cat")
    assert len(reference) == corpus.val_species.count("cat") and reference == sorted(reference)
    median = reference[len(reference) // 2]
    assert len(scorer.reference("any")) == len(corpus.val_names)
    with pytest.raises(PetmodelError, match="empty name"):
        scorer.score(["   "])
    for huge in ("a" * 100_000, "a " * 50_000):  # cut before cleaning, and its length said as given
        with pytest.raises(PetmodelError, match=f"'a ?a ?a.*… \\({len(huge):,} characters\\) is longer than 64"):
            scorer.score([huge])
    no_reference = Scorer(ckpt).score(["luna"], "dog")[0]
    assert no_reference.percentile is None and no_reference.nll < median + 1


# --------------------------------------------------------------------------- checkpoints
def test_checkpoints_of_before_still_load_and_generate(tmp_path: Path, corpus):
    """A version-1 file (written as petmodel wrote it before species) loads as an unconditioned model."""
    config = ModelConfig(hidden=32)
    torch.manual_seed(5)
    state = CharLSTM(config).state_dict()
    old_config = {k: v for k, v in config.to_dict().items() if k != "species"}
    payload = {"format": "petmodel.charlstm", "version": 1, "model_config": old_config, "alphabet": corpus.alphabet.chars,
               "state_dict": state, "meta": {"run_id": "old"}, "train_names": "bella\nmax"}
    path = tmp_path / "old.pt"
    torch.save(payload, path)
    old = load_checkpoint(path)
    assert old.species == () and old.model_config == config and old.train_names == {"bella", "max"}
    names = generate(old, GenerateConfig(n=20, seed=4)).names
    fresh = Checkpoint(config, corpus.alphabet, state)
    assert len(names) == 20 and names == generate(fresh, GenerateConfig(n=20, seed=4)).names
    with pytest.raises(PetmodelError, match="trained without species"):
        generate(old, GenerateConfig(n=5, seed=4, species="cat"))
    again = load_checkpoint(save_checkpoint(tmp_path / "v2.pt", old))  # saved now: version 2, still no species
    assert again.species == () and torch.equal(again.state_dict["head.weight"], state["head.weight"])
    payload["version"] = 2
    payload["model_config"] = {**old_config, "species": 4}
    payload["species"] = ["any", "cat", "dog", "other"]  # another order would mislabel the tokens
    torch.save(payload, path)
    with pytest.raises(PetmodelError, match="damaged"):
        load_checkpoint(path)


# --------------------------------------------------------------------------- the Generate page (AppTest)
APP = str(Path(__file__).resolve().parents[1] / "streamlit_app.py")




@pytest.fixture
def app_env(monkeypatch):
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("PETMODEL_DATA", raising=False)


def page(path: str, *, query: dict | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=30)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.switch_page(path).run()
    return at


def values(elements) -> list[str]:
    return [str(e.value) for e in elements]


def metric(at, label: str) -> str:
    found = [m.value for m in at.metric if m.label == label]
    assert found, f"no metric {label!r} in {[m.label for m in at.metric]}"
    return found[0]


def shown_names(at) -> list[str]:
    """The names on Generate as read: its name buttons' labels, Markdown escapes resolved."""
    names = [b.label for b in at.button if (b.key or "").startswith(NAME_KEY_PREFIX)]
    assert names, "no names on the page"
    return [re.sub(r"\\(.)", r"\1", name).replace("\u2060", "") for name in names]


def test_generate_species_is_part_of_the_link(species_run, monkeypatch, app_env):
    root, run_id, _ = species_run
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    query = {"model": run_id, "n": "20", "seed": "9", "species": "cat"}
    cat = page("pages/generate.py", query=query)
    assert not cat.exception and not cat.warning and not cat.error
    assert cat.radio(key="gen_species").value == "cat" and cat.query_params["species"] == "cat"
    dog = page("pages/generate.py", query={**query, "species": "dog"})
    assert shown_names(cat) != shown_names(dog) and len(shown_names(dog)) == 20
    cat.radio(key="gen_species").set_value("any").run()
    assert "species" not in cat.query_params  # "any" is the default: links from before species look the same
    assert cat.query_params["seed"] == "9"
    bad = page("pages/generate.py", query={**query, "species": "<b>horse</b>"})
    assert not bad.exception
    assert any("is not one of any, dog, cat, other" in v for v in values(bad.warning))
    assert bad.radio(key="gen_species").value == "any" and len(shown_names(bad)) == 20
    # The label says who trained the model; the dice button says what it does.
    assert "· in-process · best" in cat.selectbox(key="gen_model").format_func(run_id)
    assert cat.button(key="gen_reroll").label == "New seed"
    assert not [c for c in cat.get("code")]  # the link is a Copy link button now, not a wrapping code block
    assert cat.button(key="gen_copy").label == "Copy link"  # a Streamlit button, in the row with the download


def test_generate_page_scores_a_name(species_run, monkeypatch, app_env):
    root, run_id, ckpt = species_run
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    at = page("pages/generate.py", query={"model": run_id, "seed": "1", "species": "dog"})
    at.text_input(key="gen_score").input("Bella").run()
    assert not at.exception and not at.error
    nll = float(metric(at, "NLL per character").split()[0])
    share = metric(at, "More pet-like than")
    assert 1.0 < nll < 3.0 and re.fullmatch(r"\d+% of real dog names", share) and int(share.split("%")[0]) > 50
    tinted = next(md.value for md in at.markdown if 'data-testid="pet-surprise"' in md.value)
    assert tinted.count('class="pet-char"') == 6  # five letters and the end
    at.text_input(key="gen_score").input("xqzvvk").run()
    assert float(metric(at, "NLL per character").split()[0]) > nll + 1
    at.text_input(key="gen_score").input("<img src=x onerror=alert(1)>").run()
    assert not at.exception
    assert any("not in the alphabet" in v for v in values(at.error))
    assert not any("<img" in md.value for md in at.markdown)  # typed text never becomes markup

    # A click on a name (over what was typed) puts the name, as shown, in the box and scores it for the species.
    names = shown_names(at)
    at.button(key=f"{NAME_KEY_PREFIX}4").click().run()
    assert not at.exception and not at.error
    assert at.text_input(key="gen_score").value == names[4]
    expected = Scorer(ckpt).score([names[4]], "dog")[0]
    assert metric(at, "NLL per character") == f"{expected.nll:.2f} nats"
    assert re.fullmatch(r"\d+% of real dog names", metric(at, "More pet-like than"))
    assert shown_names(at) == names and at.query_params["species"] == "dog"


def test_a_species_link_on_a_model_without_species(corpus, tmp_path, monkeypatch, app_env):
    from petmodel.config import RunSpec, TrainConfig
    from petmodel.runner import train_in_process

    root = tmp_path / "plain-store"
    spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=5, batch_size=32), hidden=16, species=False)
    run_id = train_in_process(spec, RunStore(root), corpus=corpus)["run_id"]
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    at = page("pages/generate.py", query={"model": run_id, "seed": "3", "n": "5", "species": "cat"})
    assert not at.exception and not at.error
    assert any("trained without species" in v for v in values(at.info))
    assert at.radio(key="gen_species").disabled and len(shown_names(at)) == 5
