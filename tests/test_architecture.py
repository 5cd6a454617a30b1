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
    """petmodel modules ``path`` imports anywhere: functions and ``if TYPE_CHECKING`` included (a cycle through a
    type hint still means neither module can be read alone)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
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


MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300


def test_no_function_over_80_lines_and_no_class_over_300():
    """Every function (methods and nested functions too) in petmodel/ and pages/ fits in 80 lines,
    every class in 300, counted from its ``def``/``class`` line (decorators aside) to its last line."""
    files = [*(REPO / "petmodel").rglob("*.py"), *(REPO / "pages").glob("*.py")]
    long = []
    for path in sorted(files):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = {ast.FunctionDef: MAX_FUNCTION_LINES, ast.AsyncFunctionDef: MAX_FUNCTION_LINES,
                     ast.ClassDef: MAX_CLASS_LINES}.get(type(node))
            if limit is not None and (n := node.end_lineno - node.lineno + 1) > limit:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines, limit {limit})")
    assert not long, "too long: " + "; ".join(long)


ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"


def _blocks(markdown: str) -> list[str]:
    """The doc's blocks: each table row on its own, else each run of non-blank lines (a paragraph, a list item)."""
    blocks: list[str] = []
    current: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.lstrip().startswith("|") or not line.strip():
            if current:
                blocks.append("\n".join(current))
                current = []
            if line.strip():
                blocks.append(line)
        elif line.lstrip()[:2] in ("- ", "* ") or line.lstrip()[:1].isdigit() and ". " in line[:5]:
            if current:
                blocks.append("\n".join(current))
            current = [line]
        else:
            current.append(line)
    return blocks


def _named_in(doc: str, blocks: list[str], module: str) -> bool:
    import re

    parts = module.split(".")[1:]  # without "petmodel"
    dotted = re.compile(re.escape(module) + r"(?![\w])")
    if not parts:
        return "`petmodel/`" in doc
    if dotted.search(doc):
        return True
    path = "/".join(parts)
    if (REPO / "petmodel" / path).is_dir():  # a package: its folder
        return bool(re.search(r"(?<![\w/])(petmodel/)?" + re.escape(path) + r"/", doc))
    if re.search(r"`(petmodel/)?" + re.escape(path) + r"\.py`", doc):
        return True
    if len(parts) < 2:
        return False
    package = "/".join(parts[:-1])
    in_package = re.compile(r"(?<![\w/])(petmodel/)?" + re.escape(package) + r"/|petmodel\." + re.escape(
        ".".join(parts[:-1])) + r"(?![\w.])")
    short = re.compile(r"`" + re.escape(parts[-1]) + r"(\.py)?`")
    return any(short.search(block) and in_package.search(block) for block in blocks)


def test_every_petmodel_module_is_named_in_architecture_md():
    """docs/ARCHITECTURE.md names every module of petmodel, so the map cannot silently fall behind.

    The rule, per module (``petmodel/x/y.py`` is ``petmodel.x.y``; a package is its ``__init__``):
    the doc holds its dotted name ``petmodel.x.y`` (``petmodel.x.y.attr`` counts), or its path in
    backticks (`` `x/y.py` `` or `` `petmodel/x/y.py` ``; a top-level module as `` `y.py` ``), or its
    last name in backticks (`` `y` `` or `` `y.py` ``) inside one table row or paragraph that also
    names its package (``x/``, ``petmodel/x/`` or ``petmodel.x``). A package is named by its folder
    (``x/`` or ``petmodel/x/``) or its dotted name.
    """
    doc = ARCHITECTURE.read_text()
    blocks = _blocks(doc)
    missing = [name for name in _modules() if not _named_in(doc, blocks, name)]
    assert not missing, f"docs/ARCHITECTURE.md does not name: {', '.join(missing)}"


def _docs_and_comments(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring (module, class, function) and every comment of ``path``."""
    import io
    import tokenize

    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                found.append((node.body[0].lineno, text))
    found += [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT]
    return found


def _resolves(dotted: str) -> bool:
    """Whether ``petmodel.a.b.c`` is a module, or a module's attribute (chain), that exists."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name not in _modules():
            continue
        obj = importlib.import_module(name)
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_dotted_petmodel_paths_in_docstrings_and_comments_exist():
    """Every ``petmodel.…`` dotted path a docstring or comment in petmodel/, pages/ or benchmarks/
    names is a module, or an attribute of one (``petmodel.store.RunStore.metrics`` counts), that
    exists: a rename or a move then fails here instead of leaving the docs pointing nowhere."""
    import re

    pattern = re.compile(r"(?<![\w./-])petmodel(?:\.[A-Za-z_]\w*)+")
    files = [*(REPO / "petmodel").rglob("*.py"), *(REPO / "pages").glob("*.py"), *(REPO / "benchmarks").glob("*.py")]
    broken = [f"{path.relative_to(REPO)}:{line} {match.group(0)}"
              for path in sorted(files) for line, text in _docs_and_comments(path)
              for match in pattern.finditer(text) if not _resolves(match.group(0))]
    assert not broken, "names nothing that exists: " + "; ".join(broken)


def _string_states() -> set[str]:
    """Every word our state enums use, and the one word of Dask's client status we test (issue 42)."""
    from petmodel.app.access import Role
    from petmodel.app.pending import LaunchState
    from petmodel.cluster.failure_policy import Action
    from petmodel.cluster.failures import FailureKind
    from petmodel.status import RankState, RunStatus, StopReason

    enums = (RunStatus, RankState, StopReason, LaunchState, Role, Action, FailureKind)
    return {member.value for enum in enums for member in enum} | {"running"}


def _state_literals_compared(source: str, words: set[str]) -> list[tuple[int, str]]:
    """``x == "running"``, ``x in ("time", "cancel")``…: comparisons of a value with a state word as text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        texts = []
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            texts += [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        if any(t in words for t in texts):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_state_is_compared_as_text_outside_its_enum():
    """States are enums (``RunStatus``, ``RankState``, ``StopReason``, ``LaunchState``…): code compares members,
    so a renamed state cannot leave a comparison that is silently always false. Dask's own words live in compat."""
    words = _string_states()
    assert _state_literals_compared('if run.status == "running" or reason in ("time", "x"): pass', words) == [
        (1, "run.status == 'running'"), (1, "reason in ('time', 'x')")]  # the scan sees both forms
    homes = {REPO / "petmodel" / "compat.py", REPO / "petmodel" / "status.py", REPO / "petmodel" / "app" / "pending.py"}
    files = [*(REPO / "petmodel").rglob("*.py"), *(REPO / "pages").glob("*.py"), REPO / "streamlit_app.py"]
    hits = [f"{p.relative_to(REPO)}:{line}: {code}" for p in files if p not in homes
            for line, code in _state_literals_compared(p.read_text(), words)]
    assert not hits, "state compared as text:\n" + "\n".join(hits)
