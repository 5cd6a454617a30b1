"""A short calibration on the actual cluster: what a sweep's forecast (:mod:`petmodel.studies.forecast`) stands on.

One task per worker (the sweep's largest worker count, reserved like a run's), joined in a gloo
process group as a run's ranks are. For every planned (workers N, batch per worker b) the first N
ranks train a few real steps of the sweep's model *at once* (as they will in the run: they share
the host's memory bandwidth, its cores, its caches) on real batches cut as the loop cuts them
(sortish global batches, work-balanced slices), timing batch preparation, forward + backward, and
clipping + Adam; then they all-reduce the model's gradient size (and a quarter of it, and the stop
agreement's few floats) a few times, which the ring model is fitted to.

Steps vary with the names' lengths (an LSTM pays for the longest name of its slice), so a timed
step's compute is turned into a cost per unit of work (padded length × (rows + overhead), the cost
model of :mod:`petmodel.batches`) and multiplied by the mean work of a slice over a whole epoch; the
wait for the slowest rank is the epoch's mean gap between the busiest slice and the average one,
plus the jitter the repetitions showed. So a handful of steps forecasts an epoch's worth.

Bounded by a time budget (:data:`CALIBRATION_BUDGET_S` in all): each (N, b) gets its share, one
warm-up step and at least two timed ones. The timed steps of all pairs are taken in :data:`ROUNDS` turns
(a quarter of each pair's, then the next pair's, …), as a sweep's repeats are interleaved: timed one pair
after the other, a machine that slowed for a few seconds made the 1-worker step 5–10% slower than the runs
then measured it (issue 51), and every forecast speedup as much too high.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from petmodel.studies.forecast import AllreduceTiming, Calibration, PointTiming

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.config import RunSpec
    from petmodel.data import NameCorpus

CALIBRATION_BUDGET_S = 12.0  # seconds of timed steps in all, shared by the planned (workers, batch) pairs
MIN_REPS, MAX_REPS = 2, 16  # timed steps per pair, after one warm-up (cheap steps get more: steadier medians)
ROUNDS = 4  # the pairs' repetitions are timed in turns, a quarter each: a slower minute reaches every pair alike
ALLREDUCE_REPS = 5
AGREE_BYTES = 80  # the stop agreement: ten float64s (petmodel.train.TrainLoop.agree)


def calibrate(client: Client, spec: RunSpec, pairs: Sequence[tuple[int, int]], *, corpus: NameCorpus,
              budget_s: float = CALIBRATION_BUDGET_S) -> Calibration:
    """Measure every (workers, batch per worker) of ``pairs`` with ``spec``'s model on ``client``'s cluster.

    Holds max(workers) workers for its few seconds (refusing, naming them, when they are busy) and
    releases them; the workers are those a run of that size would get, in rank order.
    """
    from petmodel.cluster import reservations
    from petmodel.cluster.calls import CALL_TIMEOUT_S, require_answers, run_each
    from petmodel.cluster.ranks import free_port
    from petmodel.cluster.supervisor import PG_TIMEOUT_S
    from petmodel.cluster.workers import choose_workers, cpu_slots, ddp_backend, describe_workers
    from petmodel.config import counted

    pairs = sorted(set((int(n), int(b)) for n, b in pairs))
    world = max(n for n, _ in pairs)
    started = time.monotonic()
    everyone = describe_workers(client)
    held = reservations.hold_workers(client, world, everyone, wait=False)
    try:
        chosen = choose_workers(client, world, addresses=held.workers, described=everyone)
        slots = cpu_slots(everyone)
        answers = run_each(client, free_port, [chosen[0].address], timeout=CALL_TIMEOUT_S)
        require_answers(answers, CALL_TIMEOUT_S, "finding a free port for the calibration")
        [shared] = client.scatter([{"spec": spec.to_dict(), "corpus": corpus.for_training()}],
                                  workers=[chosen[0].address], broadcast=False, hash=False, timeout=CALL_TIMEOUT_S)
        futures = [client.submit(
            calibration_entry, shared=shared, plan_pairs=pairs, budget_s=float(budget_s), pg_timeout_s=PG_TIMEOUT_S,
            master_addr=chosen[0].host, master_port=answers[chosen[0].address], rank=rank, world_size=world,
            backend=ddp_backend(chosen), cpu_slot=slots.get(w.address, (0, 1 << 30))[0],
            host_workers=slots.get(w.address, (0, 1 << 30))[1], workers=[w.address], allow_other_workers=False,
            pure=False) for rank, w in enumerate(chosen)]
        try:
            results = client.gather(futures)
        except Exception as err:
            with contextlib.suppress(Exception):
                client.cancel(futures, force=True)
            from petmodel.errors import PetmodelError

            raise PetmodelError(f"The calibration for the forecast failed on the cluster ({err}).") from None
    finally:
        reservations.release(client, held.key)
    measured = results[0]
    hosts = sorted({w.host for w in chosen})
    source = f"measured on {counted(world, 'worker')} ({counted(len(hosts), 'host')}, {measured['device']})"
    return Calibration(points=tuple(PointTiming(**p) for p in measured["points"]),
                       allreduces=tuple(AllreduceTiming(**a) for a in measured["allreduces"]),
                       grad_bytes=int(measured["grad_bytes"]), agree={int(k): v for k, v in measured["agree"].items()},
                       source=source, seconds=time.monotonic() - started)


def calibration_entry(*, shared: dict[str, Any], pg_timeout_s: float, **kwargs: Any) -> dict[str, Any] | None:
    """Per-worker task: the process group (as a run's ranks get it), then :func:`_calibrate_rank`.

    Every argument is a keyword, none named like one of ``client.submit``'s own.
    """
    from dask_pytorch_ddp.dispatch import dispatch_with_ddp

    from petmodel.cluster.tuning import bound_process_group_timeout

    bound_process_group_timeout(pg_timeout_s)
    return dispatch_with_ddp(pytorch_function=_calibrate_rank, **kwargs, **shared)


def _calibrate_rank(*, spec: dict[str, Any], corpus: NameCorpus, plan_pairs: list[tuple[int, int]],
                    budget_s: float, cpu_slot: int, host_workers: int) -> dict[str, Any] | None:
    """On each worker: time the pairs (ranks below N compute, the others wait), then the all-reduces.
    Rank 0 returns the measurements, the others None."""
    import distributed
    import torch

    from petmodel.cluster.ranks import _rank_device
    from petmodel.cluster.tuning import pinned_to_own_cpus
    from petmodel.compat import worker_nthreads
    from petmodel.config import RunSpec

    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    nthreads = max(1, worker_nthreads(distributed.get_worker()))
    torch.set_num_threads(nthreads)
    device = _rank_device(0)
    run_spec = RunSpec.from_dict(spec)
    train_data, _ = corpus.encode_splits()
    counts = sorted({n for n, _ in plan_pairs} | {world})
    groups = {n: (dist.new_group(ranks=list(range(n))) if 1 < n < world else None) for n in counts}  # collective
    pin = pinned_to_own_cpus(cpu_slot, host_workers, nthreads) if device.type == "cpu" and world > 1 \
        else contextlib.nullcontext()
    with pin:
        timer = _StepProbe(run_spec, corpus.alphabet.vocab_size, train_data, device)
        share = budget_s / max(1, len(plan_pairs))
        pairs: dict[tuple[int, int], _PairSteps] = {}
        for n, b in plan_pairs:  # each pair's warm-up step and repetitions
            dist.barrier()
            if rank < n:
                pairs[(n, b)] = timer.prepare(n, b, rank, groups.get(n), share)
        for turn in range(ROUNDS):  # in turns, so drift on the machine reaches every pair alike
            for n, b in plan_pairs:
                dist.barrier()
                if rank < n:
                    timer.run(pairs[(n, b)], turn)
        points = []
        for n, b in plan_pairs:
            dist.barrier()
            if rank < n:
                points.append(timer.summarise(pairs[(n, b)]))
        allreduces, agree = [], {}
        for n in counts:
            if n < 2:
                continue
            dist.barrier()
            if rank >= n:
                continue
            for nbytes in (timer.grad_bytes, max(4, timer.grad_bytes // 4), AGREE_BYTES):
                t = _time_allreduce(n, nbytes, groups.get(n), device)
                allreduces.append({"workers": n, "nbytes": nbytes, **t})
                if nbytes == AGREE_BYTES:
                    agree[n] = t["seconds"]
        dist.barrier()
    if rank != 0:
        return None
    return {"points": points, "allreduces": allreduces, "agree": agree, "grad_bytes": timer.grad_bytes,
            "device": str(device)}


class _StepProbe:
    """The sweep's model and optimiser on one rank, and the timing of a few of its steps."""

    def __init__(self, spec: RunSpec, vocab_size: int, data: Any, device: Any) -> None:
        import torch

        from petmodel.model import CharLSTM

        self.spec, self.data, self.device = spec, data, device
        self.model_config = spec.model_config(vocab_size).for_data(data.species is not None)
        torch.manual_seed(spec.train.seed)
        self.model = CharLSTM(self.model_config).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=spec.train.lr)
        self.grad_bytes = self.model.gradient_bytes()
        self.mean_len = float(data.lengths.float().mean())
        self._ddp: dict[int, tuple[Any, Any, list[float]]] = {}  # workers → a DDP copy of the model (ddp_net)

    def ddp_net(self, group: Any) -> tuple[Any, Any, list[float]]:
        """A copy of the model wrapped in DDP over ``group`` as a run's is (collective over the group), its
        optimiser, and the list its hooks write the last gradient's hand-over time to.

        Why not the plain model: in a run, gloo reduces the first buckets while backward still computes,
        on the same core, and DDP copies every gradient into its buckets; a plain backward left that out and
        forecast 2 workers' compute 8–10% faster than their runs measured it (issue 51). A copy, because one
        module under two DDP wrappers would reduce its gradients in both groups."""
        import torch

        from petmodel.model import CharLSTM

        model = CharLSTM(self.model_config).to(self.device)
        model.load_state_dict(self.model.state_dict())
        ids = [self.device.index] if self.device.type == "cuda" else None
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group)
        handover = [0.0]

        def ready(_param: Any) -> None:
            handover[0] = time.perf_counter()

        for param in model.parameters():
            param.register_post_accumulate_grad_hook(ready)
        return net, torch.optim.Adam(model.parameters(), lr=self.spec.train.lr), handover

    def _sync(self) -> float:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def _step(self, pair: _PairSteps, gidx: Any) -> tuple[float, float, float, float]:
        """One timed step of ``pair`` on global batch ``gidx``: (data, compute, optimiser seconds, this slice's work)."""
        import torch

        from petmodel.batches import rank_slice, step_seed
        from petmodel.nll import token_nll

        lengths = self.data.lengths
        t0 = self._sync()
        idx = rank_slice(gidx, lengths, pair.rank, pair.n)
        t = int(lengths[idx].max())
        x, y = self.data.x[idx, :t].to(self.device), self.data.y[idx, :t].to(self.device)
        species = self.data.species[idx].to(self.device) if self.data.species is not None else None
        if self.model_config.dropout > 0:  # as the loop seeds each step's dropout: 1.8 ms a step, not nothing
            torch.manual_seed(step_seed(self.spec.train.seed, pair.rank, len(pair.rows)))
        net, opt, handover = pair.net or (self.model, self.opt, None)
        t1 = self._sync()
        loss = token_nll(net, x, y, self.spec.train.precision, species)
        opt.zero_grad(set_to_none=True)
        (loss / (pair.b * self.mean_len)).backward()
        t2 = self._sync()
        compute = (min(max(handover[0], t1), t2) if handover is not None else t2) - t1  # to the last hand-over
        torch.nn.utils.clip_grad_norm_(net.parameters(), self.spec.train.clip)
        opt.step()
        t3 = self._sync()
        return t1 - t0, compute, t3 - t2, _work(lengths, idx)

    def _together(self, pair: _PairSteps) -> None:
        if pair.n > 1:
            import torch

            torch.distributed.barrier(group=pair.group)

    def prepare(self, n: int, b: int, rank: int, group: Any, share_s: float) -> _PairSteps:
        """Ranks 0..n-1 together: one warm-up step at ``b`` names each, and the repetitions its share of the
        budget holds (the same on every rank), spread over an epoch's batches."""
        import torch

        from petmodel.batches import epoch_batches

        batches = epoch_batches(self.data.lengths, n * b, self.spec.train.seed, 0, self.spec.train.sortish)
        pair = _PairSteps(n, b, rank, group, batches)
        if n > 1:
            pair.net = self._ddp.get(n) or self._ddp.setdefault(n, self.ddp_net(group))
        self._together(pair)
        warm = time.perf_counter()
        self._step(pair, batches[0])
        first = torch.tensor([time.perf_counter() - warm])
        if n > 1:
            torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MAX, group=group)
        reps = max(MIN_REPS, min(MAX_REPS, int(share_s / max(float(first), 1e-6)) - 1))
        pair.picks = [batches[(i + 1) * len(batches) // (reps + 1)] for i in range(reps)]
        return pair

    def run(self, pair: _PairSteps, turn: int) -> None:
        """This turn's share of the pair's repetitions (every :data:`ROUNDS`-th, from ``turn``), after an untimed
        step: a rank that waited through the other pairs' steps is slow for its first one (cold caches, a core
        the host clocked down), which no run's rank ever is."""
        picks = pair.picks[turn::ROUNDS]
        if turn and picks:  # (a turn with none takes no step: a 6 s step at global batch 4096 is budget)
            self._together(pair)
            self._step(pair, pair.batches[0])
        for gidx in picks:
            self._together(pair)
            pair.rows.append(self._step(pair, gidx))

    def summarise(self, pair: _PairSteps) -> dict[str, Any]:
        """The pair's timing from its repetitions on every rank, and the epoch's mean work (see the module)."""
        import torch

        n, rows, reps = pair.n, pair.rows, len(pair.rows)
        table = torch.zeros(reps, n, 2, dtype=torch.float64)  # every rank's compute and work of each repetition
        for i, (_, compute, _, w) in enumerate(rows):
            table[i, pair.rank, 0], table[i, pair.rank, 1] = compute, w
        if n > 1:
            torch.distributed.all_reduce(table, group=pair.group)
        per_unit = [float(table[i, :, 0].sum() / table[i, :, 1].sum()) for i in range(reps)]
        cost = statistics.median(per_unit)
        jitter = statistics.median(max(0.0, float(table[i, :, 0].max() - table[i, :, 0].mean())
                                       - cost * float(table[i, :, 1].max() - table[i, :, 1].mean()))
                                   for i in range(reps)) if n > 1 else 0.0
        lengths = self.data.lengths
        mean_work, max_work = _epoch_work(pair.batches, lengths, n, lambda idx: _work(lengths, idx))
        compute_s = cost * mean_work
        idle_s = cost * (max_work - mean_work) + jitter if n > 1 else 0.0
        return {"workers": n, "batch_per_worker": pair.b, "compute_s": compute_s,
                "data_s": statistics.median(r[0] for r in rows), "optimizer_s": statistics.median(r[2] for r in rows),
                "idle_s": idle_s, "low_s": min(per_unit) * mean_work + idle_s,
                "high_s": max(per_unit) * mean_work + idle_s, "reps": reps, "work": mean_work}


@dataclass
class _PairSteps:
    """One (workers, batch per worker) being timed on this rank: its batches, picks and timed steps so far."""

    n: int
    b: int
    rank: int
    group: Any
    batches: Sequence[Any]
    picks: list[Any] = field(default_factory=list)
    net: tuple[Any, Any, list[float]] | None = None  # (DDP model, its optimiser, its hand-over time) when n > 1
    rows: list[tuple[float, float, float, float]] = field(default_factory=list)


def _work(lengths: Any, idx: Any) -> float:
    """A slice's work in the cost model of :mod:`petmodel.batches`: padded length × (rows + overhead)."""
    from petmodel.batches import OVERHEAD_ROWS

    return float(lengths[idx].max()) * (len(idx) + OVERHEAD_ROWS)


def _epoch_work(batches: Sequence[Any], lengths: Any, n: int, work: Any) -> tuple[float, float]:
    """Over an epoch's global batches (at most 400 of them, evenly spread): the mean work of a rank's slice,
    and the mean work of the busiest slice of each batch (what every rank waits for)."""
    from petmodel.batches import rank_slice

    step = max(1, len(batches) // 400)
    means, maxes = [], []
    for gidx in batches[::step]:
        works = [work(rank_slice(gidx, lengths, r, n)) for r in range(n)]
        means.append(sum(works) / n)
        maxes.append(max(works))
    return statistics.mean(means), statistics.mean(maxes)


def _time_allreduce(n: int, nbytes: int, group: Any, device: Any) -> dict[str, float]:
    """Median, fastest and slowest of :data:`ALLREDUCE_REPS` all-reduces of ``nbytes`` among ranks 0..n-1."""
    import torch

    dist = torch.distributed
    tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    times = []
    for i in range(ALLREDUCE_REPS + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first one sets up the connections
            times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "low_s": min(times), "high_s": max(times)}
