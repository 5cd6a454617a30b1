"""Placeholder for the sweep/search commands (scaling study issue)."""

STUDY_COMMANDS: dict = {}


def add_study_commands(sub, add_run_options) -> None:
    return None
