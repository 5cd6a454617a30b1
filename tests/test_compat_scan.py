"""No library internal outside ``petmodel/compat.py``: a scan of the code, not a list of known uses.

Every module of ``petmodel/``, ``pages/`` and ``streamlit_app.py`` but ``compat.py`` is parsed, and each of
these fails the test, named by file and line, so a new one cannot slip in:

- a private attribute (``x._name`` or ``getattr(x, "_name")``, ``x`` not ``self``/``cls``) that our code
  does not define itself (dunders, and the few underscore names the standard library documents, are public);
- an import of a third party's private module (any path segment with a leading underscore) or of one of
  Streamlit's, torch's or distributed's internal modules;
- an internal that looks public: ``callback_timeout``, ``.scheduler.identity``, ``.state.tasks``, ``rpc``, …;
- a function put on another object (a monkey-patch);
- a decision on an exception's text (``in str(err)``, ``str(err).startswith(…)``, ``err.args[0] == …``; ``err``
  bound by ``except … as err`` or a parameter typed as an exception) or on a type's name
  (``type(err).__name__ == …``).

The library's internals, and the text tests, live in ``petmodel.compat`` with their own tests
(``tests/test_compat.py``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMPAT = REPO / "petmodel" / "compat.py"
OWN_PACKAGES = frozenset({"petmodel", "pages", "streamlit_app", "tests", "benchmarks", "__future__"})
DOCUMENTED_PRIVATE = frozenset({"_exit", "_asdict", "_replace", "_make"})  # os._exit, namedtuple's methods
INTERNAL_MODULES = ("streamlit.runtime", "streamlit.web", "streamlit.elements", "streamlit.commands",
                    "streamlit.proto", "torch.distributed.distributed_c10d", "distributed.utils")
INTERNAL_IMPORTS = frozenset({("distributed", "rpc"), ("distributed", "utils"),
                              ("dask_gateway.utils", "format_template")})
INTERNAL_CHAINS = frozenset({("scheduler", "identity"), ("scheduler", "address"), ("state", "tasks"),
                             ("state", "nthreads")})
INTERNAL_NAMES = frozenset({"callback_timeout", "default_pg_timeout", "default_pg_nccl_timeout", "get_mp_context",
                            "distributed_c10d", "client.showSidebarNavigation"})
TEXT_METHODS = frozenset({"startswith", "endswith", "find", "index", "count", "match", "search", "fullmatch"})
SELF = ("self", "cls")


def scanned_files() -> list[Path]:
    """Every module the rule covers: the library, the pages and the entrypoint, but ``compat.py``."""
    files = [*(REPO / "petmodel").rglob("*.py"), *(REPO / "pages").rglob("*.py"), REPO / "streamlit_app.py"]
    return sorted(p for p in files if p != COMPAT)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def own_private_names(trees: Iterable[ast.AST]) -> frozenset[str]:
    """The underscore names our code defines (functions, classes, attributes, variables): ``x._name`` with one
    of these is ours, not a library's (``pending._run``, ``RunRecord._from_row``)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return frozenset(n for n in names if _private(n))


def _internal_module(module: str) -> bool:
    if module.split(".")[0] in OWN_PACKAGES:
        return False
    return any(_private(part) for part in module.split(".")) or any(
        module == m or module.startswith(m + ".") for m in INTERNAL_MODULES)


def _error_names(tree: ast.AST) -> set[str]:
    """Names bound to an exception: ``except … as err``, and parameters annotated as an exception type."""
    names = {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names |= {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
                      if a.annotation is not None
                      and any(w in ast.unparse(a.annotation) for w in ("Exception", "Error"))}
    return names


def _error_text(node: ast.AST, errors: set[str], texts: set[str]) -> bool:
    """Whether ``node`` holds an exception's text: ``str(err)``, ``repr(err)``, ``f"{err}"``, ``err.args``, or a
    name assigned one of those."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in ("str", "repr", "format") \
                and sub.args and isinstance(sub.args[0], ast.Name) and sub.args[0].id in errors:
            return True
        if isinstance(sub, ast.FormattedValue) and isinstance(sub.value, ast.Name) and sub.value.id in errors:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "args" and isinstance(sub.value, ast.Name) \
                and sub.value.id in errors:
            return True
        if isinstance(sub, ast.Name) and sub.id in texts:
            return True
    return False


def _type_name(node: ast.AST) -> bool:
    """``type(x).__name__`` or ``x.__class__.__name__``."""
    return isinstance(node, ast.Attribute) and node.attr == "__name__" and (
        isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "type"
        or isinstance(node.value, ast.Attribute) and node.value.attr == "__class__")


def _on_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in SELF


def _monkey_patches(tree: ast.AST) -> list[ast.Assign]:
    """Assignments of a lambda, or of a function defined in the same scope, to another object's attribute."""
    found = []
    for scope in ast.walk(tree):
        if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            local = {n.name for n in scope.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            found += [node for node in ast.walk(scope) if isinstance(node, ast.Assign) and node not in found
                      and any(isinstance(t, ast.Attribute) and not _on_self(t.value) for t in node.targets)
                      and (isinstance(node.value, ast.Lambda) or isinstance(node.value, ast.Name)
                           and node.value.id in local)]
    return found


def _findings(tree: ast.AST, own: frozenset[str]) -> Iterable[tuple[ast.AST, str]]:
    errors = _error_names(tree)
    texts = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _error_text(node.value, errors, set())
             for t in node.targets if isinstance(t, ast.Name)}
    patches = _monkey_patches(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own | DOCUMENTED_PRIVATE \
                and not _on_self(node.value):
            yield node, "a private attribute"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1 and not _on_self(node.args[0]) \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and _private(node.args[1].value) and node.args[1].value not in own:
            yield node, "a private attribute"
        if isinstance(node, ast.Import) and any(_internal_module(a.name) for a in node.names) \
                or isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                _internal_module(node.module) or any(_internal_module(f"{node.module}.{a.name}")
                                                     or (node.module, a.name) in INTERNAL_IMPORTS for a in node.names)):
            yield node, "a library's internal module"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and (node.value.attr, node.attr) in INTERNAL_CHAINS and not _on_self(node.value.value) \
                or isinstance(node, ast.Attribute) and node.attr in INTERNAL_NAMES \
                or isinstance(node, ast.keyword) and node.arg in INTERNAL_NAMES \
                or isinstance(node, ast.Constant) and node.value in INTERNAL_NAMES:
            yield node, "an undocumented internal"
        if node in patches:
            yield node, "a monkey-patch"
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                    _error_text(s, errors, texts) for s in node.comparators) \
                    or any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops) and any(
                    _error_text(s, errors, texts) for s in sides):
                yield node, "a decision on an exception's text"
            elif any(_type_name(s) for s in sides) and not all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                yield node, "a decision on a type's name"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TEXT_METHODS \
                and any(_error_text(n, errors, texts) for n in (node.func.value, *node.args)):
            yield node, "a decision on an exception's text"


def scan(source: str, where: str, own: frozenset[str] = frozenset()) -> list[str]:
    """``where:line: what: code`` for every library internal, or decision on an exception's text, in ``source``."""
    return [f"{where}:{getattr(node, 'lineno', '?')}: {what}: {ast.unparse(node)[:100]}"
            for node, what in _findings(ast.parse(source), own)]


def test_no_library_internal_is_used_outside_compat() -> None:
    files = scanned_files()
    assert len(files) > 100 and REPO / "pages" / "_ui.py" in files
    sources = {p: p.read_text() for p in files}
    own = own_private_names(ast.parse(s) for s in sources.values())
    found = [line for p, s in sources.items() for line in scan(s, str(p.relative_to(REPO)), own)]
    assert not found, ("library internals outside petmodel/compat.py (move each there, with a test in "
                       "tests/test_compat.py):\n" + "\n".join(found))


@pytest.mark.parametrize("code", [
    "client._register_worker_plugin(plugin)",
    "fields = getattr(options, '_fields', None)",
    "st._main.empty()",
    "from distributed._concurrent_futures_thread import ThreadPoolExecutor",
    "import torch._dynamo",
    "from torch import _C",
    "from streamlit.runtime.scriptrunner import get_script_run_ctx",
    "from distributed import rpc",
    "import torch.distributed.distributed_c10d as c10d",
    "client.sync(fn, callback_timeout=5)",
    "client.run_on_scheduler(fn, callback_timeout=5)",
    "kwargs.setdefault('callback_timeout', 5)",
    "n = worker.state.nthreads",
    "client.scheduler.identity()",
    "gateway.close = lambda: None",
    "def close():\n    pass\ngateway.close = close",
    "try:\n    f()\nexcept ValueError as err:\n    if 'global' in str(err).lower():\n        pass",
    "try:\n    f()\nexcept ValueError as err:\n    ok = str(err).startswith('No space')",
    "try:\n    f()\nexcept ValueError as err:\n    text = str(err)\n    ok = 'full' in text",
    "try:\n    f()\nexcept ValueError as err:\n    ok = err.args[0] == 'x'",
    "try:\n    f()\nexcept ValueError as err:\n    ok = 'x' in f'{err}'",
    "def full(err: BaseException) -> bool:\n    return 'No space left' in str(err)",
    "ok = type(err).__name__ == 'JSONDecodeError'",
    "ok = err.__class__.__name__ in ('A', 'B')",
])
def test_the_scan_flags_each_kind_of_internal(code: str) -> None:
    found = scan(code, "example.py")
    assert found and all(line.startswith("example.py:") for line in found), code


@pytest.mark.parametrize("code", [
    "self._x = 1\ncls._y()",
    "os._exit(1)",
    "point._replace(x=1)",
    "name = type(x).__name__",
    "ok = type(x) is int",
    "from pages._ui import backend",
    "from distributed.diagnostics.plugin import UploadFile",
    "ok = 'a' in str(value)",
    "try:\n    f()\nexcept ValueError as err:\n    raise RuntimeError(f'failed: {err}') from err",
    "handler.callback = self.on_event",
    "class Search:\n    def run(self): ...\n    def launch(self, t, run):\n        t.run = run",
])
def test_the_scan_leaves_public_uses_alone(code: str) -> None:
    assert scan(code, "example.py") == []


def test_our_own_private_names_are_not_a_librarys() -> None:
    own = own_private_names([ast.parse("class Record:\n    @classmethod\n    def _from_row(cls, row): ...")])
    assert scan("Record._from_row(row)", "example.py", own) == []
    assert scan("client._call(x)", "example.py", own) != []
