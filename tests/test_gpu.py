"""Training on CUDA GPUs, and the backend choice for ranks that share one.

Two kinds of tests. Those marked ``gpu`` need a CUDA device and skip without one (the only skips
CI allows, see conftest): training in fp32 and bf16 on the GPU, the embedded cluster's one worker per
GPU, a two-rank run whose ranks share one GPU (gloo on CUDA tensors: NCCL needs one GPU per rank), and
a GPU-trained checkpoint on a CPU. The others run everywhere: :func:`petmodel.cluster.workers.ddp_backend`
on constructed workers, and the GPU probe's tolerance of a missing or broken CUDA.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from pathlib import Path

import pytest
import torch

from petmodel.cluster.workers import WorkerInfo, _gpu_probe, _read_probe, ddp_backend
from petmodel.config import GenerateConfig, RunSpec, TrainConfig

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
TINY = dict(hidden=64, embed=16, dropout=0.0)


def tiny_spec(**train) -> RunSpec:
    cfg = dict(max_seconds=None, max_steps=40, batch_size=128, lr=0.01, checkpoint_every_s=0)
    cfg.update(train)
    return RunSpec(train=TrainConfig(**cfg), **TINY)


def worker(address: str, host: str = "10.0.0.1", *, gpus: int = 1, uuid: str | None = "GPU-a") -> WorkerInfo:
    return WorkerInfo(address=address, name=address, host=host, nthreads=1, memory_limit=0, gpu_count=gpus,
                      gpu_name="H200" if gpus else None, pid=1, gpu_uuid=uuid if gpus else None)


# --------------------------------------------------------------------------- everywhere: the backend rule
def test_two_ranks_sharing_one_gpu_use_gloo():
    assert ddp_backend([worker("tcp://a:1"), worker("tcp://a:2")]) == "gloo"


def test_ranks_each_on_a_gpu_of_their_own_use_nccl():
    assert ddp_backend([worker("tcp://a:1", uuid="GPU-a"), worker("tcp://a:2", uuid="GPU-b")]) == "nccl"
    assert ddp_backend([worker("tcp://a:1", "h1"), worker("tcp://b:1", "h2", uuid="GPU-b")]) == "nccl"
    assert ddp_backend([worker("tcp://a:1")]) == "nccl"  # one rank on one GPU


def test_any_rank_without_a_gpu_or_a_known_gpu_means_gloo():
    assert ddp_backend([worker("tcp://a:1", uuid="GPU-a"), worker("tcp://a:2", gpus=0)]) == "gloo"
    assert ddp_backend([worker("tcp://a:1", gpus=0), worker("tcp://a:2", gpus=0)]) == "gloo"
    # A GPU whose UUID nobody could read may be shared: NCCL would fail on it, gloo runs.
    assert ddp_backend([worker("tcp://a:1", uuid=None), worker("tcp://a:2", uuid="GPU-b")]) == "gloo"
    assert ddp_backend([]) == "gloo"


def test_the_gpu_probe_reports_this_process_and_no_uuid_without_a_gpu():
    count, name, pid, uuid = _gpu_probe()
    assert pid == os.getpid()
    assert (count > 0) == torch.cuda.is_available()
    assert (name is not None) == (uuid is not None) == (count > 0)


def test_the_gpu_probe_tolerates_a_broken_cuda(monkeypatch):
    def broken() -> bool:
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert _gpu_probe() == (0, None, os.getpid(), None)


def test_a_gpu_without_a_readable_uuid_keeps_its_count(monkeypatch):
    def no_properties(device: object) -> object:
        raise RuntimeError("no device properties")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_properties)
    assert _gpu_probe() == (1, "Fake GPU", os.getpid(), None)


def test_probe_answers_without_a_uuid_read_as_unknown():
    from petmodel.cluster.calls import NoAnswer

    assert _read_probe((1, "H200", 42)) == (1, "H200", 42, None)  # an answer in the older 3-field shape
    assert _read_probe((1, "H200", 42, "GPU-a")) == (1, "H200", 42, "GPU-a")
    assert _read_probe(NoAnswer("tcp://a:1", "timeout")) == (0, None, None, None)
    assert _read_probe(None) == (0, None, None, None)


# --------------------------------------------------------------------------- on a GPU
def _spy_devices(monkeypatch) -> set[tuple[str, str]]:
    """Record (weights' device, batch's device) of every loss the training loop computes."""
    import petmodel.train as train

    seen: set[tuple[str, str]] = set()
    real = train.token_nll

    def spy(model, x, y, precision="fp32", species=None):
        seen.add((next(model.parameters()).device.type, x.device.type))
        return real(model, x, y, precision, species)

    monkeypatch.setattr(train, "token_nll", spy)
    return seen


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_on_the_gpu_lowers_the_loss_with_the_weights_on_the_gpu(corpus, monkeypatch, precision):
    from petmodel.train import train_model

    seen = _spy_devices(monkeypatch)
    spec = tiny_spec(precision=precision)
    train_data, val_data = corpus.encode_splits()
    rows: list[dict] = []
    result = train_model(spec.model_config(corpus.alphabet.vocab_size), spec.train, train_data, val_data,
                         device="cuda", on_metrics=rows.append)
    assert seen == {("cuda", "cuda")}
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    assert statistics.mean(losses[-5:]) < statistics.mean(losses[:5]) - 0.2, losses
    assert math.isfinite(result.best_val_nll) and result.best_val_nll < math.log(corpus.alphabet.vocab_size)
    assert all(t.device.type == "cpu" for t in result.best_state.values())  # snapshots are CPU copies


@pytest.mark.gpu
@needs_cuda
def test_a_checkpoint_trained_on_the_gpu_loads_and_generates_on_the_cpu(corpus, monkeypatch, tmp_path: Path):
    from petmodel.checkpoint import load_checkpoint
    from petmodel.generate import generate
    from petmodel.precision import local_device
    from petmodel.runner import train_in_process
    from petmodel.store import RunStore

    assert local_device() == "cuda"  # where train_in_process trains
    seen = _spy_devices(monkeypatch)
    out = train_in_process(tiny_spec(max_steps=60), RunStore(tmp_path), corpus=corpus)
    assert seen == {("cuda", "cuda")} and out["status"] == "completed"
    raw = torch.load(out["model_path"], weights_only=True)  # no map_location: a CPU-only machine reads it as is
    assert all(t.device.type == "cpu" for t in raw["state_dict"].values())
    ckpt = load_checkpoint(out["model_path"])
    config = GenerateConfig(n=50, seed=7)
    first, again = generate(ckpt, config, device="cpu").names, generate(ckpt, config, device="cpu").names
    assert first == again and len(first) == 50
    on_gpu = ckpt.build_model("cuda")
    assert next(on_gpu.parameters()).is_cuda
    moved = on_gpu.to("cpu")
    for key, value in moved.state_dict().items():
        assert torch.equal(value, ckpt.state_dict[key]), key  # GPU and back is bit-exact
    assert generate(ckpt, config, model=moved).names == first
    # On the GPU itself it generates too (its random stream is not the CPU's, so other names).
    assert len(generate(ckpt, config, device="cuda").names) == 50


def _device_facts() -> dict[str, object]:
    """Run on a worker: which GPU it trains on."""
    import torch as t

    index = t.cuda.current_device()
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "current": index,
            "uuid": str(t.cuda.get_device_properties(index).uuid)}


@pytest.mark.gpu
@needs_cuda
def test_the_embedded_cluster_has_one_worker_per_gpu_each_on_its_own(corpus, tmp_path: Path):
    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.launch import launch_run
    from petmodel.cluster.local import start_local_cluster
    from petmodel.cluster.workers import describe_workers
    from petmodel.store import RunStore

    try:
        import dask_cuda  # noqa: F401 - required here, not optional: without it every worker sees every GPU
    except ImportError as err:  # not installed, or its cuda-core too old ("from cuda.core import Device")
        pytest.fail(f"dask-cuda does not import ({err}); pip install -r requirements-gpu.txt")
    gpus = torch.cuda.device_count()
    client = start_local_cluster()
    try:
        assert type(client.cluster).__name__ == "LocalCUDACluster"
        facts = list(client.run(_device_facts).values())
        assert len(facts) == gpus
        uuids = [f["uuid"] for f in facts]
        assert len(set(uuids)) == gpus  # no two workers on one GPU
        assert set(uuids) == {str(torch.cuda.get_device_properties(i).uuid) for i in range(gpus)}
        assert len({str(f["visible"]).split(",")[0] for f in facts}) == gpus  # dask-cuda's pinning
        workers = describe_workers(client)
        assert sorted(w.gpu_uuid for w in workers) == sorted(uuids)
        assert ddp_backend(workers) == "nccl"
        # A run on every GPU: NCCL refuses two ranks on one device, so this also checks each rank's device.
        result = launch_run(client, tiny_spec(max_steps=6, batch_size=16).with_(workers=gpus), RunStore(tmp_path),
                            corpus=corpus).wait(300)
        assert result["status"] == "completed" and result["backend"] == "nccl"
    finally:
        shutdown(client)


@pytest.mark.gpu
@needs_cuda
def test_two_ranks_sharing_one_gpu_train_over_gloo_on_cuda(corpus, monkeypatch, tmp_path: Path):
    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.launch import launch_run
    from petmodel.cluster.local import start_local_cluster
    from petmodel.cluster.workers import describe_workers
    from petmodel.store import RunStore
    from petmodel.train import train_model

    # Without dask-cuda the embedded cluster's workers all see the GPUs; both are shown only the first.
    monkeypatch.setitem(sys.modules, "dask_cuda", None)
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    with pytest.warns(RuntimeWarning, match="dask_cuda is not installed"):
        client = start_local_cluster(2, 1, config={"distributed.nanny.pre-spawn-environ.CUDA_VISIBLE_DEVICES": first})
    try:
        workers = describe_workers(client)
        assert [w.gpu_count for w in workers] == [1, 1]
        assert workers[0].gpu_uuid is not None and workers[0].gpu_uuid == workers[1].gpu_uuid
        assert ddp_backend(workers) == "gloo"
        spec = tiny_spec(max_steps=20, batch_size=32)
        store = RunStore(tmp_path)
        handle = launch_run(client, spec.with_(workers=2), store, corpus=corpus)
        result = handle.wait(300)
    finally:
        shutdown(client)
    assert result["status"] == "completed" and result["backend"] == "gloo", result
    assert store.get_run(result["run_id"]).backend == "gloo"
    assert [r["device"] for r in handle.rank_results] == ["cuda:0", "cuda:0"]
    # The same as one rank with twice the batch on the GPU (the gradients really were averaged over gloo).
    train_data, val_data = corpus.encode_splits()
    one = train_model(spec.model_config(corpus.alphabet.vocab_size), spec.with_(batch_size=64).train, train_data,
                      val_data, device="cuda")
    assert result["final_val_nll"] == pytest.approx(one.final_val_nll, abs=5e-3)
