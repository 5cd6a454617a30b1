"""The layout rules of docs/ARCHITECTURE.md, checked: small modules, no import cycles, no Streamlit
in the library, a torch-free config."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((REPO / "petmodel").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """petmodel modules ``path`` imports anywhere (functions included), except under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def test_no_module_is_over_500_lines():
    files = [*(REPO / "petmodel").rglob("*.py"), *(REPO / "pages").glob("*.py"), REPO / "streamlit_app.py"]
    long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_no_import_cycles_between_petmodel_modules():
    modules = _modules()
    graph = {name: _imports(path, name, set(modules)) for name, path in modules.items()}
    # A package's __init__ re-exporting its own submodules is not a cycle worth reporting.
    graph = {n: {t for t in ts if not t.startswith(n + ".")} for n, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name)
            assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_the_library_never_imports_streamlit():
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "petmodel").rglob("*.py")
                 if "import streamlit" in p.read_text() or "from streamlit" in p.read_text()]
    assert offenders == []


def test_config_and_the_cli_parser_import_no_torch():
    code = ("import sys; import petmodel.config, petmodel.cli; petmodel.cli.build_parser(); "
            "import petmodel.studies; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
