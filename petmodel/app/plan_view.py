"""The Experiments page's Plan section, apart from Streamlit: make a plan, its table, and what its buttons launch.

:func:`plan_for` measures on the cluster a study would use (the connected one, else the embedded one at
the largest shape a sweep gets here), as ``python -m petmodel plan`` does (:mod:`petmodel.studies.planning`);
:func:`plan_frame` is the table shown; :func:`recommended_spec` is the run "Launch the recommendation"
starts and :func:`check_sweep` the equivalent sweep "Check it as a sweep" starts (the recommendation's global
batch and learning rate on 1 worker up to its workers: it measures the speedup the plan counted on).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from petmodel.studies.defaults import SWEEP_EVAL_EVERY_SAMPLES

if TYPE_CHECKING:
    from petmodel.app.backend import AppBackend
    from petmodel.config import RunSpec
    from petmodel.studies.plan import SweepConfig
    from petmodel.studies.target_plan import TargetPlan

PLAN_COLUMNS = ["choice", "workers", "global_batch", "batch_per_worker", "lr", "steps", "step_ms",
                "time_to_target_s", "time_range_s"]


def plan_for(be: AppBackend, values: Mapping[str, Any], *, target_nll: float, max_workers: int | None) -> TargetPlan:
    """The plan for the Experiments form's model (``values``) to reach ``target_nll`` on the study cluster."""
    from petmodel.app.forms import study_base_from_form
    from petmodel.studies.planning import plan_for_target
    from petmodel.studies.sizing import local_study_cluster

    spec = study_base_from_form(values)
    corpus = be.corpus(spec.data)
    client = be.ensure_study_cluster(local_study_cluster(None))
    return plan_for_target(client, be.store, spec, corpus, target_nll=target_nll, max_workers=max_workers)


def plan_frame(plan: Mapping[str, Any]) -> pd.DataFrame:
    """One row per candidate, the recommendation first: its setting, steps, step time and time to the target."""
    records = [{"choice": "★" if i == 0 else "", "workers": r["workers"],
                "global_batch": r["global_batch"], "batch_per_worker": r["batch_per_worker"],
                "lr": r["lr"], "steps": round(r["steps"]), "step_ms": r["step_s"] * 1e3,
                "time_to_target_s": r["time_s"],
                "time_range_s": f"{r['time_low_s']:.1f}–{r['time_high_s']:.1f}"}
               for i, r in enumerate(plan.get("rows", []))]
    return pd.DataFrame.from_records(records, columns=PLAN_COLUMNS)


def eval_every_steps(global_batch: int) -> int:
    """Validate every 1,024 samples, as the plan's forecast assumes (and a sweep does)."""
    return max(1, round(SWEEP_EVAL_EVERY_SAMPLES / global_batch))


def recommended_spec(values: Mapping[str, Any], plan: Mapping[str, Any]) -> RunSpec:
    """The run of the plan's recommendation: the form's model and budget, the plan's workers, batch and rate."""
    from petmodel.app.forms import study_base_from_form

    rec = plan["recommended"]
    return study_base_from_form(values).with_(
        workers=int(rec["workers"]), batch_size=int(rec["batch_per_worker"]), lr=float(rec["lr"]),
        eval_every_steps=eval_every_steps(int(rec["global_batch"])), eval_every_seconds=None,
        note=f"The plan's recommendation for NLL {plan['target_nll']:g} (forecast {rec['time_s']:.1f} s).")


def check_sweep(values: Mapping[str, Any], plan: Mapping[str, Any]) -> SweepConfig:
    """An equivalent sweep of the recommendation's global batch and rate over 1 … its workers (powers of two)."""
    from petmodel.app.forms import study_base_from_form
    from petmodel.studies.plan import SweepConfig

    rec = plan["recommended"]
    top = max(int(rec["workers"]), max(r["workers"] for r in plan["rows"]))
    workers = [2 ** i for i in range(top.bit_length())]
    return SweepConfig(base=study_base_from_form(values).with_(lr=float(rec["lr"])), workers=workers,
                       global_batches=[int(rec["global_batch"])], lrs=[float(rec["lr"])],
                       target_nll=float(plan["target_nll"]), equivalent=True, name="check of a plan")
