"""petmodel.threads: in-process training takes the cores that are free, not every core (issue 52)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from petmodel import threads
from petmodel.errors import UsageError
from petmodel.threads import CpuSample, choose_threads, free_cores, read_sample, use_free_cores

STAT = """cpu  300 0 100 500 20 0 0 0 0 0
cpu0 100 0 50 200 10 0 0 0 0 0
cpu1 150 0 40 280 10 0 0 0 0 0
cpu2 50 0 10 20 0 0 0 0 0 0
intr 12345
"""
# comm with a space and a parenthesis, as /proc allows; utime 7, stime 3
SELF = "4242 (py (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 3 0 10 0 0\n"


@pytest.fixture
def torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("free, limit, expected", [
    (2.0, 2, 2), (1.8, 2, 2), (1.65, 2, 2),  # a little load from others: every thread
    (1.55, 2, 1), (1.0, 2, 1), (0.9, 2, 1),  # half a core busy or more: one thread, not two fighting over a core
    (0.0, 2, 1),  # every core busy: still one thread
    (15.6, 4, 4),  # never more than torch's own default
    (None, 3, 3),  # no reading: torch's default stands
])
def test_choose_threads_takes_the_free_cores(free: float | None, limit: int, expected: int) -> None:
    assert choose_threads(free, limit) == expected


def test_free_cores_counts_idle_and_our_own_ticks_as_free() -> None:
    before = CpuSample(idle=1000, total=4000, own=50, cpus=2)
    one_core_busy = CpuSample(idle=1020, total=4040, own=50, cpus=2)  # 40 ticks: 20 idle, 20 someone else's
    assert free_cores(before, one_core_busy) == pytest.approx(1.0)
    ours_busy = CpuSample(idle=1020, total=4040, own=70, cpus=2)  # the busy ticks were this process's
    assert free_cores(before, ours_busy) == pytest.approx(2.0)
    assert free_cores(before, before) is None  # no time passed


def test_read_sample_reads_only_the_cpus_this_process_may_use(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "stat").write_text(STAT)
    (tmp_path / "self").write_text(SELF)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    sample = read_sample(str(tmp_path / "stat"), str(tmp_path / "self"))
    assert sample == CpuSample(idle=200 + 10 + 280 + 10, total=360 + 480, own=10, cpus=2)
    assert read_sample(str(tmp_path / "missing"), str(tmp_path / "self")) is None


def test_use_free_cores_takes_one_thread_when_one_of_two_cores_is_busy(monkeypatch, torch_threads) -> None:
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    readings = iter([CpuSample(0, 0, 0, 2), CpuSample(20, 40, 0, 2)])  # half of 2 cores idle over the sample
    monkeypatch.setattr(threads, "read_sample", lambda: next(readings))
    monkeypatch.setattr(threads, "torch_default_threads", lambda: 2)
    choice = use_free_cores(sample_s=0)
    assert (choice.threads, choice.free, torch.get_num_threads()) == (1, 1.0, 1)
    assert choice.note() == ("training on 1 thread, not 2: only 1.0 of the cores were free at the start "
                             "($PETMODEL_THREADS sets the number).")


def test_use_free_cores_keeps_torchs_default_without_a_reading(monkeypatch, torch_threads) -> None:
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    monkeypatch.setattr(threads, "read_sample", lambda: None)
    monkeypatch.setattr(threads, "torch_default_threads", lambda: 2)
    choice = use_free_cores(sample_s=0)
    assert (choice.threads, choice.free, choice.note()) == (2, None, None)


def test_one_thread_at_most_needs_no_reading(monkeypatch, torch_threads) -> None:
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    monkeypatch.setattr(threads, "read_sample", lambda: pytest.fail("nothing to choose: no reading"))
    monkeypatch.setattr(threads, "torch_default_threads", lambda: 1)  # e.g. OMP_NUM_THREADS=1
    assert use_free_cores().threads == 1


def test_the_environment_overrides_the_choice(monkeypatch, torch_threads) -> None:
    monkeypatch.setenv(threads.THREADS_ENV, "3")
    monkeypatch.setattr(threads, "read_sample", lambda: pytest.fail("an override needs no reading"))
    choice = use_free_cores()
    assert (choice.threads, choice.overridden, choice.note(), torch.get_num_threads()) == (3, True, None, 3)
    monkeypatch.setenv(threads.THREADS_ENV, "0")
    with pytest.raises(UsageError, match=r"^\$PETMODEL_THREADS must be a whole number of threads ≥ 1, not '0'"):
        use_free_cores()
