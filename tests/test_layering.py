"""The code's layering: import-linter's contracts (pyproject.toml ``[tool.importlinter]``) hold, and no
private name (leading underscore) is used outside the module that defines it.

The private-name check reads the source (``ast``), so it sees every use wherever it sits, imports
inside functions included: ``from dnnperf.x import _name``, ``module._name`` where ``module`` is a
dnnperf module bound by an import (``import dnnperf.x as module``, ``from dnnperf import x``), and a
private name imported from the tests' ``conftest``. It does not follow relative imports (dnnperf has
none) or names given as strings (``monkeypatch.setattr(module, "_name", ...)``). Each check also runs
on a small planted tree with a known violation, so that it is seen to fail.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from collections import ChainMap
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

ROOT = Path(__file__).resolve().parents[1]
#: Modules whose private names tests may not import (the tests' shared helpers).
CONFTEST = ("conftest", "tests.conftest")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class PrivateUses:
    """Finds uses of a package's (and conftest's) private names outside the module defining them."""

    def __init__(self, package: str, package_dir: Path) -> None:
        self.package = package
        self.package_dir = package_dir

    def is_module(self, dotted: str) -> bool:
        """Whether ``dotted`` names a module or package of the scanned package (or conftest)."""
        if dotted in CONFTEST:
            return True
        parts = dotted.split(".")
        if parts[0] != self.package:
            return False
        path = self.package_dir.joinpath(*parts[1:])
        return (path / "__init__.py").is_file() or path.with_suffix(".py").is_file()

    def module_of(self, path: Path) -> str | None:
        """The dotted name of a file inside the package; None outside it."""
        try:
            relative = path.resolve().relative_to(self.package_dir.resolve())
        except ValueError:
            return Path(path).stem if Path(path).name == "conftest.py" else None
        parts = [self.package, *relative.with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def watched(self, module: str) -> bool:
        return module in CONFTEST or module == self.package or module.startswith(self.package + ".")

    def scan(self, path: Path) -> Iterator[str]:
        """``file:line: what`` for each private name ``path`` uses from another module."""
        own = self.module_of(path)
        tree = ast.parse(Path(path).read_text(), str(path))
        for line, what in self._walk(tree, ChainMap(self._bindings(tree)), own):
            yield f"{path}:{line}: {what}"

    def _bindings(self, scope: ast.AST) -> dict[str, str | None]:
        """Names a scope binds: to the dotted module an import binds, else to None (a plain value
        shadows a module of the same name in an outer scope)."""
        names: dict[str, str | None] = {}
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = scope.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                names[arg.arg] = None
            for arg in (arguments.vararg, arguments.kwarg):
                if arg is not None:
                    names[arg.arg] = None
        for node in _scope_nodes(scope):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = alias.name if self.is_module(alias.name) else None
                    else:
                        top = alias.name.split(".")[0]
                        names[top] = top if self.is_module(top) else None
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                for alias in node.names:
                    dotted = f"{module}.{alias.name}"
                    names[alias.asname or alias.name] = dotted if self.is_module(dotted) else None
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.setdefault(node.id, None)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.setdefault(node.name, None)
        return names

    def _walk(
        self, node: ast.AST, scope: ChainMap[str, str | None], own: str | None
    ) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                inner = scope.new_child(self._bindings(child))
                yield from self._walk(child, inner, own)
                continue
            if isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if self.watched(module) and module != own:
                    for alias in child.names:
                        if _is_private(alias.name):
                            yield child.lineno, f"from {module} import {alias.name}"
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    parts = alias.name.split(".")
                    if self.watched(alias.name) and any(_is_private(p) for p in parts):
                        yield child.lineno, f"import {alias.name}"
            elif isinstance(child, ast.Attribute):
                found = self._private_attribute(child, scope, own)
                if found is not None:
                    yield child.lineno, found
                    continue
            yield from self._walk(child, scope, own)

    def _private_attribute(
        self, node: ast.Attribute, scope: Mapping[str, str | None], own: str | None
    ) -> str | None:
        """``module._name`` (through any chain of submodules) when ``module`` is an imported module."""
        chain: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or scope.get(base.id) is None:
            return None
        module = scope[base.id]
        assert module is not None
        for attr in chain:
            if self.is_module(f"{module}.{attr}"):
                module = f"{module}.{attr}"
                continue
            if _is_private(attr) and module != own and self.watched(module):
                return f"{module}.{attr}"
            return None
        return None


def _scope_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one scope, not descending into nested functions and classes."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def private_uses(package: str, package_dir: Path, roots: Iterable[Path]) -> list[str]:
    """Every private name used outside its module, in the Python files under ``roots``."""
    scanner = PrivateUses(package, package_dir)
    return [use for root in roots for path in sorted(root.rglob("*.py")) for use in scanner.scan(path)]


def broken_contracts(config: Path, cwd: Path, pythonpath: Path | None = None) -> tuple[list[str], str]:
    """The names of the contracts in ``config`` that import-linter finds broken, and its report.
    A run that fails without naming a broken contract (a bad configuration) fails the test here."""
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--no-logo", str(config)]
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath is not None else None
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    report = result.stdout + result.stderr
    broken = re.findall(r"^(.+) BROKEN$", result.stdout, re.MULTILINE)
    assert result.returncode == 0 or broken, f"lint-imports failed (exit {result.returncode}):\n{report}"
    return broken, report


def test_the_import_contracts_hold() -> None:
    broken, report = broken_contracts(ROOT / "pyproject.toml", ROOT)
    assert not broken, f"broken import contracts: {', '.join(broken)}\n{report}"


def test_the_contract_check_reports_a_planted_upward_import(tmp_path: Path) -> None:
    """A two-layer package: kept while the lower layer imports nothing above it, broken (and the
    offending import named) once it does."""
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("from planted import low\n")
    (package / "low.py").write_text("VALUE = 1\n")
    config = tmp_path / "contracts.toml"
    config.write_text(
        textwrap.dedent(
            """\
            [tool.importlinter]
            root_package = "planted"

            [[tool.importlinter.contracts]]
            name = "planted layers"
            type = "layers"
            containers = ["planted"]
            layers = ["high", "low"]
            """
        )
    )
    assert broken_contracts(config, tmp_path, tmp_path)[0] == []
    (package / "low.py").write_text("from planted import high\n\nVALUE = 1\n")
    broken, report = broken_contracts(config, tmp_path, tmp_path)
    assert broken == ["planted layers"]
    assert "planted.low -> planted.high" in report


def test_no_private_name_is_used_outside_its_module() -> None:
    roots = [ROOT / folder for folder in ("src", "tests", "benchmarks")]
    uses = private_uses("dnnperf", ROOT / "src" / "dnnperf", roots)
    assert not uses, "private names used outside their module:\n" + "\n".join(uses)


def test_the_private_name_check_reports_each_planted_use(tmp_path: Path) -> None:
    """Every form of use is reported at its line; the defining module's own uses, a shadowed name
    and public names are not."""
    files = {
        "src/planted/__init__.py": "",
        "src/planted/a.py": "_SECRET = 1\n\n\ndef public():\n    return _SECRET\n",
        "src/planted/sub/__init__.py": "",
        "src/planted/sub/b.py": "def _hidden():\n    pass\n",
        "src/planted/c.py": textwrap.dedent(
            """\
            import planted.sub.b
            from planted import a
            from planted.a import _SECRET, public
            from planted.sub import b as bee


            def f(a):
                import planted.a as alias

                return a._SECRET, alias._SECRET, public()


            VALUE = a._SECRET + bee._hidden() + planted.sub.b._hidden()
            """
        ),
        "tests/conftest.py": "def _helper():\n    pass\n\n\ndef helper():\n    return _helper()\n",
        "tests/test_planted.py": "from conftest import _helper, helper\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    uses = private_uses("planted", tmp_path / "src" / "planted", [tmp_path / "src", tmp_path / "tests"])
    c, test = tmp_path / "src/planted/c.py", tmp_path / "tests/test_planted.py"
    assert uses == [
        f"{c}:3: from planted.a import _SECRET",
        f"{c}:10: planted.a._SECRET",
        f"{c}:13: planted.a._SECRET",
        f"{c}:13: planted.sub.b._hidden",
        f"{c}:13: planted.sub.b._hidden",
        f"{test}:1: from conftest import _helper",
    ]
