"""The run store shared by the CLI and the app: runs, studies and metrics in SQLite, checkpoints beside it."""

from petmodel.store.owners import current_owner
from petmodel.store.records import RunRecord, StudyRecord, metric_record
from petmodel.store.folders import default_store_dir
from petmodel.store.runstore import RunStore
from petmodel.store.schema import ACTIVE_STATUSES, FINISHED_STATUSES, METRIC_COLUMNS, STATUSES

__all__ = ["ACTIVE_STATUSES", "FINISHED_STATUSES", "METRIC_COLUMNS", "STATUSES", "RunRecord", "RunStore", "StudyRecord",
           "current_owner", "default_store_dir", "metric_record"]
