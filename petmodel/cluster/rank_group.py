"""One formation of a run's ranks: submitted together, one task per worker, polled into a frozen status.

:meth:`RankGroup.submit` asks rank 0's worker for a free port, scatters the payload once (the
names are large) and submits one :func:`~petmodel.cluster.ranks.rank_entry` task pinned to each
worker, everything by keyword (``client.submit`` swallows its own keyword names). :meth:`RankGroup.poll`
looks at the tasks and, when it must, asks the cluster why one failed, and returns a
:class:`~petmodel.cluster.failures.GroupStatus`: a value the failure policy decides on without Dask. A run that
re-forms makes a new group on the workers it has left.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import distributed
from distributed import Client

from petmodel.cluster.calls import CALL_TIMEOUT_S, PING_TIMEOUT_S, first_silent, require_answers, run_each
from petmodel.cluster.failures import (FailureKind, GroupStatus, RankError, RankFailure, crash_failure,
                                       error_summary)
from petmodel.cluster.ranks import free_port, rank_entry
from petmodel.cluster.workers import WorkerInfo, describe_workers
from petmodel.compat import future_errored
from petmodel.errors import PetmodelError
from petmodel.status import RankState

__all__ = ["GroupStatus", "RankGroup", "live_workers"]

LIVE_TIMEOUT_S = 5.0  # bound on asking the scheduler which workers are still in the cluster
EXCEPTION_TIMEOUT_S = 5.0  # bound on fetching the exception a failed rank raised
# Bound on fetching the finished ranks' results (rank 0's carries the final snapshot, megabytes): generous for
# a slow link, but a network that drops large messages (an MTU black hole) would otherwise hang the run forever.
RESULTS_TIMEOUT_S = 120.0
# A task's Dask state, as the rank table shows it.
RANK_STATES = {"pending": RankState.TRAINING, "finished": RankState.DONE, "error": RankState.FAILED,
               "cancelled": RankState.CANCELLED, "lost": RankState.LOST}  # Dask's words (keys) → ours


def live_workers(client: Client) -> set[str] | None:
    """Addresses of the cluster's workers now, or ``None`` when the scheduler did not say."""
    try:
        return {w.address for w in describe_workers(client, timeout=LIVE_TIMEOUT_S, probe_gpus=False)}
    except Exception:  # noqa: BLE001 - a slow or lost scheduler is not a failed run; ask again next time
        return None


class RankGroup:
    """The tasks of one formation of a run, one per worker (rank order), and what is known about them."""

    def __init__(self, client: Client, run_id: str, workers: list[WorkerInfo]) -> None:
        self.client, self.run_id, self.workers = client, run_id, list(workers)
        self.futures: list[distributed.Future] = []
        self._left: set[int] = set()
        self._frozen: set[int] = set()
        self._errors: list[RankError] = []
        self._failure: RankFailure | None = None
        self._final_states: dict[int, str] | None = None  # kept by forget()
        self.answered_at: float | None = None  # when the scheduler last said which workers are alive (monotonic)

    @property
    def addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    def submit(self, shared: dict[str, Any], slots: dict[str, tuple[int, int]], *, backend: str,
               pg_timeout_s: float) -> None:
        """Submit one task per rank, each pinned to its worker; ``shared`` is scattered once.

        ``slots``: :func:`~petmodel.cluster.workers.cpu_slots` of the whole cluster, so that ranks of
        concurrent runs on one host pin different cores. On failure, tasks already submitted are
        cancelled (rank 0 would otherwise wait for its peers until the timeout) and the error raised.
        """
        client, chosen = self.client, self.workers
        try:
            answers = run_each(client, free_port, [chosen[0].address], timeout=CALL_TIMEOUT_S)
            require_answers(answers, CALL_TIMEOUT_S, "finding a free port for the run")
            port = answers[chosen[0].address]
            try:
                [shared_future] = client.scatter([shared], workers=[chosen[0].address], broadcast=False, hash=False,
                                                 timeout=CALL_TIMEOUT_S)
            except OSError:  # TimeoutError or a comm that closed mid-send: the payload is large, the pings were not
                raise PetmodelError(
                    f"The training names did not reach worker {chosen[0].address} within {CALL_TIMEOUT_S:g} s: the "
                    "network between this machine and the cluster stalls or drops large messages (an MTU "
                    "mismatch?) or is very slow; fix it and launch again.") from None
            local_ranks: dict[str, int] = {}
            for rank, w in enumerate(chosen):
                cpu_slot, host_workers = slots.get(w.address, (0, 1 << 30))  # unknown: never pin
                local_rank = local_ranks.get(w.host, 0)
                local_ranks[w.host] = local_rank + 1
                self.futures.append(client.submit(
                    rank_entry, shared=shared_future, pg_timeout_s=pg_timeout_s, master_addr=chosen[0].host,
                    master_port=port, rank=rank, world_size=len(chosen), backend=backend,
                    local_rank=local_rank, cpu_slot=cpu_slot, host_workers=host_workers,
                    workers=[w.address], allow_other_workers=False, pure=False,
                    key=f"petmodel-rank{rank}-{self.run_id}",
                ))
        except Exception:
            with contextlib.suppress(Exception):
                client.cancel(self.futures, force=True)
            raise

    def poll(self, *, check_workers: bool = False) -> GroupStatus:
        """The group now. The first rank that raised is explained (a dead or frozen peer is the root
        cause, not the ranks it broke); ``check_workers`` also asks whether every worker is still there."""
        futures = list(self.futures)
        done = frozenset(r for r, f in enumerate(futures) if f.done())
        all_done = all(r in done for r in range(len(futures)) if r not in self._left | self._frozen)
        if self._failure is None:
            errored = next((r for r, f in enumerate(futures) if future_errored(f)), None)
            if errored is not None:
                self._failure = self._explain(errored, futures[errored])
        if check_workers and not all_done:
            self._check_workers()
        return GroupStatus(states=tuple(str(f.status) for f in futures), done=done, errors=tuple(self._errors),
                           left=frozenset(self._left), frozen=frozenset(self._frozen), failure=self._failure,
                           all_done=all_done)

    def stop(self) -> GroupStatus:
        """End this formation: a last poll, then the tasks still running are cancelled (abandoned)."""
        status = self.poll()
        pending = [r for r, f in enumerate(self.futures) if not f.done()]
        if pending:
            self.client.cancel([self.futures[r] for r in pending], force=True)
        return replace(status, done=frozenset(range(len(self.futures))) - set(pending), ended=True)

    def rank_states(self) -> dict[int, str]:
        """Each rank's task state as the rank table shows it: training, done, failed, cancelled or lost."""
        if self._final_states is not None:
            return dict(self._final_states)
        return {rank: RANK_STATES.get(f.status, str(f.status)) for rank, f in enumerate(list(self.futures))}

    def forget(self) -> None:
        """Let go of the tasks once the run has ended, keeping their states for the rank table.

        Their results (rank 0's carries a snapshot) then leave the workers' memory: Dask never retires
        a worker that holds data no other worker has, so a worker kept busy by a finished run's result
        could not be given back (:mod:`petmodel.cluster.scaling`).
        """
        self._final_states = self.rank_states()
        futures, self.futures = self.futures, []
        for future in futures:
            with contextlib.suppress(Exception):  # a closing client
                future.release()

    def results(self, timeout: float = RESULTS_TIMEOUT_S) -> list[Any]:
        """Every rank's task result, in rank order (only once every task has finished); a one-sentence
        :class:`PetmodelError` when they have not all arrived within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        out = []
        for rank, future in enumerate(self.futures):
            try:
                out.append(future.result(timeout=max(0.1, deadline - time.monotonic())))
            except TimeoutError:
                raise PetmodelError(
                    f"Rank {rank}'s result did not arrive from worker {self.workers[rank].address} within "
                    f"{timeout:g} s after the ranks finished: the network between this machine and the workers "
                    "stalls or drops large messages (an MTU mismatch?) or is very slow; the run's last snapshot "
                    "is kept, so resume it once the network is fixed.") from None
        return out

    def _check_workers(self) -> None:
        live = live_workers(self.client)
        if live is None:
            return
        self.answered_at = time.monotonic()
        self._left |= {r for r, w in enumerate(self.workers) if w.address not in live}
        if self._left and self._failure is None:
            rank = min(self._left)
            self._failure = RankFailure(FailureKind.LOST, rank, self.workers[rank].address)

    def _explain(self, rank: int, fut: distributed.Future) -> RankFailure:
        """Why ``rank`` raised: its worker or a peer's left, a peer froze, or the rank itself failed."""
        try:
            exc = fut.exception(timeout=EXCEPTION_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the summary then says "unknown error"
            exc = None
        error = RankError(rank, type(exc).__name__ if exc is not None else "", error_summary(exc))
        self._errors.append(error)
        live = live_workers(self.client)
        if live is not None:
            for r, w in enumerate(self.workers):
                if w.address not in live:  # a dead peer is the root cause, not the ranks it broke
                    self._left.add(r)
                    return RankFailure(FailureKind.LOST, r, w.address)
        # A frozen peer (still in the cluster) makes the healthy ranks time out: blame the one that is silent.
        silent = first_silent(self.client, [a for r, a in enumerate(self.addresses) if r != rank],
                              timeout=PING_TIMEOUT_S)
        if silent is not None:
            r = self.addresses.index(silent)
            self._frozen.add(r)
            return RankFailure(FailureKind.FROZEN, r, silent)
        return crash_failure(error, self.workers[rank].address)
