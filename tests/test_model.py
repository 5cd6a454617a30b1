"""Training loop, checkpoints and generation on the real data, with tiny models."""

from __future__ import annotations

import io
import os
import pickle
import time
from pathlib import Path

import pytest
import torch

from petmodel.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from petmodel.data import Alphabet, encode_names
from petmodel.errors import PetmodelError, UsageError
from petmodel.config import GenerateConfig
from petmodel.generate import generate
from petmodel.config import ModelConfig
from petmodel.config import TrainConfig
from petmodel.batches import OVERHEAD_ROWS, balanced_slices, epoch_batches
from petmodel.nll import evaluate_nll
from petmodel.train import train_model


@pytest.mark.parametrize("kwargs, message", [
    ({"lr": 0}, "Learning rate"), ({"lr": -1}, "Learning rate"), ({"batch_size": 0}, "Batch size"),
    ({"epochs": 0}, "Epochs"), ({"max_seconds": 0}, "time budget"), ({"epochs": None, "max_seconds": None},
                                                                    "epoch count or a time budget"),
    ({"precision": "fp8"}, "Precision"),
])
def test_train_config_rejects_impossible_values(kwargs, message):
    with pytest.raises(UsageError, match=message):
        TrainConfig(**kwargs)


def _slice_costs(lengths: torch.Tensor, sizes: list[int]) -> list[int]:
    bounds = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    return [int(lengths[b - 1]) * (b - a + OVERHEAD_ROWS) for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("world", [2, 3, 4, 16])
def test_balanced_slices_cover_the_batch_and_even_out_the_work(world: int):
    g = torch.Generator().manual_seed(world)
    for _ in range(20):
        batch = 64 * world
        lengths = torch.sort(torch.randint(1, 12, (batch,), generator=g) ** 2 // 6 + 1).values  # a long tail
        sizes = balanced_slices(lengths, world)
        assert len(sizes) == world and sum(sizes) == batch and min(sizes) >= 1
        equal = _slice_costs(lengths, [64] * world)
        balanced = _slice_costs(lengths, sizes)
        assert max(balanced) <= max(equal)
        if world == 2:  # optimal: no cut point has a cheaper worst slice
            assert max(balanced) == min(max(_slice_costs(lengths, [k, batch - k])) for k in range(1, batch))
    assert balanced_slices(torch.tensor([3, 3, 5]), 1) == [3]
    assert balanced_slices(torch.tensor([1, 2, 3]), 3) == [1, 1, 1]
    # the long names go to the slice with fewer rows
    sizes = balanced_slices(torch.tensor([4] * 96 + [40] * 32), 2)
    assert sizes[0] > sizes[1] and sum(sizes) == 128


def test_epoch_batches_are_disjoint_and_repeatable():
    lengths = torch.randint(1, 20, (1000,))
    a = epoch_batches(lengths, 64, seed=3, epoch=2, sortish=True)
    b = epoch_batches(lengths, 64, seed=3, epoch=2, sortish=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    flat = torch.cat(a)
    assert len(a) == 1000 // 64 and len(flat) == len(set(flat.tolist()))  # drop_last, no repeats
    c = epoch_batches(lengths, 64, seed=3, epoch=3, sortish=True)
    assert not torch.equal(torch.cat(c), flat)  # a new order each epoch
    spread = sum(int(lengths[x].max() - lengths[x].min()) for x in a) / len(a)
    assert spread < 5  # sortish: names of similar length share a batch


def test_training_lowers_validation_nll(corpus):
    tr, va = encode_names(corpus.train_names, corpus.alphabet), encode_names(corpus.val_names, corpus.alphabet)
    rows = []
    mc = ModelConfig(vocab_size=corpus.alphabet.vocab_size, hidden=64, dropout=0.0)
    result = train_model(mc, TrainConfig(max_seconds=None, max_steps=90, batch_size=64, lr=0.01,
                                         eval_every_steps=30), tr, va, on_metrics=rows.append)
    vals = [r["val_nll"] for r in rows if r["kind"] == "val"]
    assert vals[0] < 3.0 and vals[-1] < vals[0]  # log(30) = 3.4 is the uniform guess
    assert result.best_val_nll == min(vals) and result.steps == 90 and result.stopped_by == "steps"
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 91))
    assert train_rows[-1]["samples"] == 90 * 64
    model = torch.nn.Module()
    from petmodel.model import CharLSTM

    m = CharLSTM(mc)
    m.load_state_dict(result.best_state)
    assert evaluate_nll(m, va) == pytest.approx(result.best_val_nll, rel=1e-5)


def test_time_budget_and_cancel_stop_training(corpus):
    tr = encode_names(corpus.train_names, corpus.alphabet)
    mc = ModelConfig(vocab_size=corpus.alphabet.vocab_size, hidden=16)
    t = time.perf_counter()
    r = train_model(mc, TrainConfig(max_seconds=1.0, batch_size=32), tr, None)
    assert r.stopped_by == "time" and time.perf_counter() - t < 5
    r = train_model(mc, TrainConfig(max_seconds=30, batch_size=32), tr, None, should_stop=lambda: True)
    assert r.stopped_by == "cancel" and r.steps == 0


def test_bf16_trains_where_the_cpu_runs_it_and_is_refused_in_one_sentence_where_not(corpus):
    from petmodel.errors import UnsupportedPrecision
    from petmodel.precision import bf16_supported

    tr, va = encode_names(corpus.train_names, corpus.alphabet), encode_names(corpus.val_names[:200], corpus.alphabet)
    mc = ModelConfig(vocab_size=corpus.alphabet.vocab_size, hidden=32, dropout=0.0)
    config = TrainConfig(max_seconds=None, max_steps=40, batch_size=64, lr=0.01, precision="bf16")
    if bf16_supported("cpu"):
        assert train_model(mc, config, tr, va).best_val_nll < 3.2
        return
    with pytest.raises(UnsupportedPrecision, match=r"^bf16 precision does not run on this machine's CPU \(\w+: no "
                                                  r"AVX-512 BF16 or AMX\); choose fp32 precision\.$"):
        train_model(mc, config, tr, va)


def test_the_bf16_probe_agrees_with_a_real_bf16_lstm_step():
    """The cached probe must say what a real step does: a probe that always said yes (or no) fails here."""
    from petmodel.precision import bf16_supported

    lstm = torch.nn.LSTM(16, 32, batch_first=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = lstm(torch.randn(4, 5, 16))
        out.float().sum().backward()
        works = True
    except RuntimeError:
        works = False
    assert bf16_supported("cpu") is works


def test_checkpoint_round_trip(tiny_run, tmp_path: Path):
    store, result = tiny_run
    ckpt = load_checkpoint(result["model_path"])
    assert ckpt.meta["run_id"] == result["run_id"] and ckpt.alphabet == Alphabet()
    assert ckpt.meta["val_nll"] == pytest.approx(result["val_nll"], abs=1e-4)
    assert len(ckpt.train_names) > 10_000
    copy = save_checkpoint(tmp_path / "copy.pt", ckpt)
    again = load_checkpoint(copy)
    assert all(torch.equal(again.state_dict[k], ckpt.state_dict[k]) for k in ckpt.state_dict)
    assert not list(tmp_path.glob(".*.tmp"))


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_pickle_that_runs_code_is_refused(tmp_path: Path):
    _Evil.marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format": "petmodel.charlstm", "payload": _Evil()}, path)
    with pytest.raises(PetmodelError, match="asks to run code"):
        load_checkpoint(path)
    assert not _Evil.marker.exists()
    plain = tmp_path / "evil.pkl"
    plain.write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(PetmodelError):
        load_checkpoint(plain)
    assert not _Evil.marker.exists()


def _truncated_checkpoint() -> bytes:
    buf = io.BytesIO()
    torch.save({"format": "petmodel.charlstm", "w": torch.zeros(64)}, buf)
    return buf.getvalue()[:200]


@pytest.mark.parametrize("payload", [
    b"not a checkpoint at all", b"",
    b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n",  # /etc/passwd
    bytes(range(256)) * 4, b"\x80\x04K\x01.", b"\x80\x02]q\x00(K\x01h\x00e.", b"PK\x03\x04" + b"\x00" * 64,
    "truncated",
])
def test_foreign_files_are_not_checkpoints(tmp_path: Path, payload):
    path = tmp_path / "x.pt"
    path.write_bytes(_truncated_checkpoint() if payload == "truncated" else payload)
    with pytest.raises(PetmodelError, match="not a petmodel checkpoint"):
        load_checkpoint(path)


def test_checkpoint_from_elsewhere(tmp_path: Path):
    path = tmp_path / "resnet.pt"
    torch.save(torch.nn.Linear(3, 2).state_dict(), path)
    with pytest.raises(PetmodelError, match="not a petmodel checkpoint"):
        load_checkpoint(path)
    with pytest.raises(PetmodelError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


def test_generate_is_repeatable_and_uses_alphabet(tiny_run):
    _, result = tiny_run
    ckpt = load_checkpoint(result["model_path"])
    a = generate(ckpt, GenerateConfig(n=200, seed=7)).names
    b = generate(ckpt, GenerateConfig(n=200, seed=7)).names
    c = generate(ckpt, GenerateConfig(n=200, seed=8)).names
    assert a == b and a != c and len(a) == 200
    assert all(n and set(n) <= set(Alphabet().chars) and n == n.strip() for n in a)


def test_generate_prefix_topk_new_only(tiny_run):
    ckpt = load_checkpoint(tiny_run[1]["model_path"])
    names = generate(ckpt, GenerateConfig(n=50, seed=1, prefix="Ma", top_k=3)).names
    assert all(n.startswith("ma") for n in names)
    new = generate(ckpt, GenerateConfig(n=100, seed=1, new_only=True, temperature=1.5)).names
    assert len(new) == 100 and len(set(new)) == 100 and not set(new) & ckpt.train_names
    many = generate(ckpt, GenerateConfig(n=10_000, seed=0)).names
    assert len(many) == 10_000
    low = generate(ckpt, GenerateConfig(n=300, seed=0, temperature=0.2)).names
    assert len(set(low)) < len(set(many[:300]))  # colder sampling repeats the likeliest names


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": 0}, "Temperature"), ({"temperature": 100}, "Temperature"), ({"n": 0}, "number of names"),
    ({"top_k": 0}, "top-k"), ({"prefix": "x" * 30}, "prefix"),
])
def test_generate_config_rejects(kwargs, message):
    with pytest.raises(UsageError, match=message):
        GenerateConfig(**kwargs)


def test_generate_prefix_with_digits(tiny_run):
    ckpt = load_checkpoint(tiny_run[1]["model_path"])
    with pytest.raises(PetmodelError, match="not in the alphabet"):
        generate(ckpt, GenerateConfig(prefix="max9"))
    assert isinstance(ckpt, Checkpoint)


def test_oversized_models_are_refused_before_allocating(monkeypatch):
    import time

    from petmodel.config import RunSpec, estimated_memory_bytes

    start = time.monotonic()
    for kwargs in ({"hidden": 100_000}, {"hidden": 8192, "layers": 16}):
        with pytest.raises(UsageError, match=r"need about .* GB per worker .* over the 16 GB limit") as info:
            RunSpec(**kwargs)
        assert "\n" not in str(info.value)
    assert time.monotonic() - start < 1  # refused from arithmetic, nothing allocated
    small = RunSpec()
    assert 20e6 < estimated_memory_bytes(small) < 500e6
    monkeypatch.setenv("PETMODEL_MAX_MODEL_GB", "0.01")
    with pytest.raises(UsageError, match="over the 0.01 GB limit"):
        RunSpec()
    monkeypatch.setenv("PETMODEL_MAX_MODEL_GB", "many")
    with pytest.raises(UsageError, match="must be a number of gigabytes"):
        RunSpec()


@pytest.mark.parametrize("seed", [10**23, -1, 2**63, True])
def test_impossible_seeds_are_one_sentence(seed):
    with pytest.raises(UsageError, match="seed must be a whole number"):
        TrainConfig(seed=seed)


@pytest.mark.parametrize("shape", [dict(), dict(layers=2, hidden=24, embed=8), dict(species=3, hidden=16)])
def test_the_config_counts_the_weights_the_model_builds(shape: dict) -> None:
    """Memory checks count the weights from the config alone (before torch loads); the model is the truth."""
    from petmodel.model import CharLSTM

    config = ModelConfig(vocab_size=31, **shape)
    model = CharLSTM(config)
    assert config.parameter_count() == sum(p.numel() for p in model.parameters())
    assert model.gradient_bytes() == 4 * config.parameter_count()  # fp32 weights, every one trained
