"""The installed set is the tested set: every requirement pinned in constraints.txt, the test tools exact,
and this environment holding exactly the versions the lock names (so a green run vouches for them)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]


def _requirements(name: str) -> list[Requirement]:
    lines = (REPO / name).read_text().splitlines()
    return [Requirement(line.split("#")[0].strip()) for line in lines
            if line.split("#")[0].strip() and not line.lstrip().startswith("-")]


def _locked() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==(\S+)", line).groups()
            pins[canonicalize_name(name)] = version
    return pins


def test_every_direct_requirement_is_locked_and_the_test_tools_are_exact():
    locked = _locked()
    assert len(locked) > 50  # the whole resolved set, not only the direct requirements
    for name in ("requirements.txt", "requirements-dev.txt"):
        for req in _requirements(name):
            key = canonicalize_name(req.name)
            assert key in locked, f"{req.name} ({name}) is not in constraints.txt: run .ci/refresh-constraints"
            assert req.specifier.contains(locked[key], prereleases=True), (req, locked[key])
    for req in _requirements("requirements-dev.txt"):
        assert [s.operator for s in req.specifier] == ["=="], f"{req} is a test tool and must be pinned exactly"
    readme = (REPO / "README.md").read_text()
    assert "pip install -r requirements.txt -c constraints.txt && streamlit run streamlit_app.py" in readme
    assert "pip install -r requirements-dev.txt -c constraints.txt && python -m pytest -q" in readme


def test_this_environment_runs_the_locked_versions():
    """Fails where the suite runs on other versions than constraints.txt names (install with the README's
    test command): a pass then says nothing about the set a new user gets."""
    wrong = []
    for name, version in _locked().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{name} missing (locked {version})")
            continue
        if not SpecifierSet(f"=={version}").contains(installed, prereleases=True):
            wrong.append(f"{name} {installed} (locked {version})")
    assert wrong == []
