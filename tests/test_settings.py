"""petmodel.settings: numbers from the environment and whole-number checks, each wrong value one sentence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from petmodel.cluster import local
from petmodel.config import DEFAULT_MAX_MODEL_GB, MAX_MODEL_GB_ENV, RunSpec, max_model_bytes
from petmodel.errors import UsageError
from petmodel.settings import env_number, require_whole, whole_number_rule
from petmodel.sources import DEFAULT_MAX_MB, MAX_MB_ENV, max_data_bytes

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the helpers themselves
def test_env_number_reads_a_good_value_and_defaults_when_unset(monkeypatch) -> None:
    monkeypatch.delenv("PETMODEL_TEST_NUMBER", raising=False)
    assert env_number("PETMODEL_TEST_NUMBER", 7, kind=int, minimum=1) == 7
    monkeypatch.setenv("PETMODEL_TEST_NUMBER", "   ")  # blank is unset
    assert env_number("PETMODEL_TEST_NUMBER", 7, kind=int, minimum=1) == 7
    monkeypatch.setenv("PETMODEL_TEST_NUMBER", " 3 ")
    assert env_number("PETMODEL_TEST_NUMBER", 7, kind=int, minimum=1) == 3
    monkeypatch.setenv("PETMODEL_TEST_NUMBER", "2.5")
    assert env_number("PETMODEL_TEST_NUMBER", 1.0, above=0) == 2.5


@pytest.mark.parametrize("text, kind", [("lots", int), ("1.5", int), ("0", int), ("-2", float), ("inf", float),
                                        ("nan", float)])
def test_env_number_refuses_in_one_sentence(monkeypatch, text: str, kind: type) -> None:
    monkeypatch.setenv("PETMODEL_TEST_NUMBER", text)
    with pytest.raises(UsageError) as info:
        env_number("PETMODEL_TEST_NUMBER", 7, kind=kind, minimum=1, unit="workers")
    words = "a whole number" if kind is int else "a number"
    assert str(info.value) == (f"$PETMODEL_TEST_NUMBER must be {words} of workers ≥ 1, not {text!r}; "
                               "fix it, or unset it for the default.")


def test_require_whole_keeps_the_sentence_format() -> None:
    assert require_whole("Batch size", 4) == 4
    assert whole_number_rule(1, 100_000) == "a whole number from 1 to 100,000"
    for bad in (0, -1, 1.5, True, "3", None):
        with pytest.raises(UsageError) as info:
            require_whole("Batch size", bad)
        assert str(info.value) == f"Batch size must be a whole number ≥ 1, not {bad!r}."
    with pytest.raises(UsageError, match=r"^Workers must be a whole number ≥ 0 \(0 trains here\), not -1\.$"):
        require_whole("Workers", -1, minimum=0, rule="a whole number ≥ 0 (0 trains here)")
    with pytest.raises(UsageError, match="^Maximum length must be a whole number from 1 to 64, not 65.$"):
        require_whole("Maximum length", 65, maximum=64)


# --------------------------------------------------------------------------- $PETMODEL_MAX_MODEL_GB
def test_max_model_gb(monkeypatch) -> None:
    monkeypatch.delenv(MAX_MODEL_GB_ENV, raising=False)
    assert max_model_bytes() == int(DEFAULT_MAX_MODEL_GB * 1e9)
    monkeypatch.setenv(MAX_MODEL_GB_ENV, "0.5")
    assert max_model_bytes() == 500_000_000
    for bad in ("many", "0", "-1", "inf"):
        monkeypatch.setenv(MAX_MODEL_GB_ENV, bad)
        with pytest.raises(UsageError, match=rf"^\$PETMODEL_MAX_MODEL_GB must be a number of gigabytes above 0, "
                                             rf"not '{bad}'; "):
            RunSpec()


def test_a_bad_max_model_gb_is_one_sentence_from_the_cli_not_a_traceback() -> None:
    # The defaults are built at import; reading the variable there would fail every command with a traceback.
    env = {**os.environ, "PETMODEL_MAX_MODEL_GB": "many"}  # conftest points the store and cache at temp folders
    out = subprocess.run([sys.executable, "-m", "petmodel", "train", "--max-seconds", "1"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == ("error: $PETMODEL_MAX_MODEL_GB must be a number of gigabytes above 0, not 'many'; "
                                  "fix it, or unset it for the default.")


# --------------------------------------------------------------------------- $PETMODEL_MAX_DATA_MB
def test_max_data_mb(monkeypatch) -> None:
    monkeypatch.delenv(MAX_MB_ENV, raising=False)
    assert max_data_bytes() == int(DEFAULT_MAX_MB * 1e6)
    monkeypatch.setenv(MAX_MB_ENV, "2.5")
    assert max_data_bytes() == 2_500_000
    for bad in ("lots", "0", "-3"):
        monkeypatch.setenv(MAX_MB_ENV, bad)
        with pytest.raises(UsageError, match=rf"^\$PETMODEL_MAX_DATA_MB must be a number of megabytes above 0, "
                                             rf"not '{bad}'; "):
            max_data_bytes()


# --------------------------------------------------------------------------- $PETMODEL_MAX_LOCAL_WORKERS
def test_max_local_workers(monkeypatch) -> None:
    monkeypatch.setattr(local.os, "cpu_count", lambda: 2)
    monkeypatch.delenv(local.MAX_LOCAL_WORKERS_ENV, raising=False)
    assert local.max_local_workers(1) == 8 and local.max_local_workers(2) == 4
    monkeypatch.setenv(local.MAX_LOCAL_WORKERS_ENV, "3")
    assert local.max_local_workers(1) == 3
    for bad in ("many", "2.5", "0", "-1"):  # once silently ignored: now the operator hears of it
        monkeypatch.setenv(local.MAX_LOCAL_WORKERS_ENV, bad)
        with pytest.raises(UsageError, match=rf"^\$PETMODEL_MAX_LOCAL_WORKERS must be a whole number of workers ≥ 1, "
                                             rf"not '{bad}'; "):
            local.max_local_workers(1)
