"""The layers of src/lrlhf import only what they may (read from the source with ``ast``, nothing is imported).

Every ``import lrlhf.x`` / ``from lrlhf.x import ...`` / ``from lrlhf import x`` counts, at module level or inside a
function. A package is the first name under ``lrlhf`` (``modules``, ``eval``, ``run``...; ``strategies`` for the
top-level file); ``from lrlhf import __version__`` is the root and always allowed. Besides the floors: only ``run``
reads the composed Hydra config (imports ``hydra`` / ``omegaconf``), no two files import each other through a circle
but the one docs/architecture.md names, and no file name repeats for different things but those it names.
"""

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "lrlhf"

# package -> the packages it may import (itself always); None: no rule
ONLY = {
    "functional": {"functional"},  # pure tensor math (torch only; tests/functional/test_imports.py)
    "utils": {"utils", "functional"},
    "data": {"data", "utils", "functional"},
}
# package -> the packages it must not import (run, the orchestration floor, may import every package)
NEVER = {
    "models": {"rewards", "modules", "callbacks", "eval", "run"},
    # the reward protocol and its sources, one floor below every consumer (modules, eval, callbacks, run)
    "rewards": {"strategies", "modules", "callbacks", "eval", "run", "labelling"},
    "modules": {"callbacks", "eval", "run"},
    "eval": {"modules", "callbacks", "run"},  # measures models; never a LightningModule or a callback
    "callbacks": {"run"},  # may use eval (held-out path, judges, plots)
    "strategies": {"rewards", "modules", "callbacks", "eval", "run"},  # below modules: they use its FSDP pieces
    "labelling": {"models", "strategies", "modules", "callbacks", "run"},  # people: files and the annotators only
}
#: Third-party packages only these packages of lrlhf import (the composed config is the entry point's alone).
CONFIG_PACKAGES = ("hydra", "omegaconf")
CONFIG_READERS = {"run"}
#: File-level import circles that are true to the domain (named in docs/architecture.md).
DOMAIN_CIRCLES = [{"lrlhf.models.ensemble", "lrlhf.models.reward"}]  # an ensemble is a reward model made of RMs
#: File names used on several floors for one concept (named in docs/architecture.md, "One name per thing").
SHARED_NAMES = {"advantages.py", "annotators.py", "kto.py", "utility.py"}
# (file relative to src/lrlhf, imported package): known violations to remove, each with why it is still here
ALLOWED_FOR_NOW: dict[tuple[str, str], str] = {}


def _package(path: Path) -> str:
    parts = path.relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else path.stem


def _imported_packages(path: Path) -> list[tuple[int, str]]:
    return _imports(path.read_text(), path.relative_to(SRC).with_suffix("").parts)


def _imports(source: str, here: tuple[str, ...]) -> list[tuple[int, str]]:
    """``(line, package)`` of every lrlhf import in ``source``, the module ``lrlhf.<here joined by dots>`` (e.g.
    ``("data", "toy", "world")``; relative imports are resolved against it)."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: "from .x import y" inside lrlhf/<package>/...
                base = ".".join(("lrlhf", *here[: len(here) - node.level]))
                names = [f"{base}.{node.module}"] if node.module else [f"{base}.{a.name}" for a in node.names]
            elif node.module == "lrlhf":
                names = [f"lrlhf.{alias.name}" for alias in node.names]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "lrlhf" or len(parts) < 2:
                continue
            target = parts[1]
            if (SRC / target).is_dir() or (SRC / f"{target}.py").is_file():  # not the root's __version__
                found.append((node.lineno, target))
    return found


def violations() -> list[str]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        package = _package(path)
        for line, target in _imported_packages(path):
            if target == package:
                continue
            allowed = ONLY.get(package)
            bad = (allowed is not None and target not in allowed) or target in NEVER.get(package, set())
            key = (str(path.relative_to(SRC)), target)
            if bad and key not in ALLOWED_FOR_NOW:
                out.append(f"src/lrlhf/{key[0]}:{line}: {package} imports lrlhf.{target}")
    return out


def test_every_layer_imports_only_what_it_may():
    found = violations()
    assert not found, "layer rule broken (see tests/test_architecture.py):\n" + "\n".join(found)


def test_the_allow_list_holds_only_violations_that_still_exist():
    current = {(str(p.relative_to(SRC)), t) for p in SRC.rglob("*.py") for _, t in _imported_packages(p)}
    stale = sorted(k for k in ALLOWED_FOR_NOW if k not in current)
    assert not stale, f"remove these entries from ALLOWED_FOR_NOW, the imports are gone: {stale}"


def test_the_checker_sees_function_level_relative_and_root_imports():
    code = ("import lrlhf.modules.ppo\n"
            "from lrlhf import run, __version__\n"
            "from .judges import resolve_judge\n"
            "def f():\n    from lrlhf.callbacks.early_stopping import HeldOutUtilityEarlyStopping\n")
    assert sorted(t for _, t in _imports(code, ("eval", "probe"))) == ["callbacks", "eval", "modules", "run"]
    assert [t for _, t in _imports("from ..modules import reward\n", ("eval", "probe"))] == ["modules"]
    assert [t for _, t in _imports("from .. import callbacks\n", ("eval", "probe"))] == ["callbacks"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST):
    """The import nodes of ``tree`` outside ``if TYPE_CHECKING:`` blocks (those never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for child in node.body for n in ast.walk(child)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in skip]


def import_graph() -> dict[str, set[str]]:
    """File-level edges: ``lrlhf.a.b`` -> every lrlhf module it imports (a package's ``__init__`` only when the
    package itself is imported: ``from lrlhf.a import b`` is an edge to ``lrlhf.a.b`` when that is a module)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name or None

    graph = {}
    for name, path in modules.items():
        edges = set()
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                found = resolve(target) if target.startswith("lrlhf.") else None
                if found and found not in (name, "lrlhf"):
                    edges.add(found)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_files_but_the_domains():
    found = [c for c in circles(import_graph()) if c not in DOMAIN_CIRCLES]
    assert not found, f"import circles between files: {[sorted(c) for c in found]}"
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    for circle in DOMAIN_CIRCLES:
        assert all(f"`{m.split('.', 1)[1].replace('.', '/')}.py`" in doc for m in circle), circle


def test_the_circle_finder_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_only_run_reads_the_composed_config():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if _package(path) in CONFIG_READERS:
            continue
        for node in _runtime_imports(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if not getattr(node, "level", 0) and any(n.split(".")[0] in CONFIG_PACKAGES for n in names):
                found.append(f"src/lrlhf/{path.relative_to(SRC)}:{node.lineno}")
    assert not found, f"hydra / omegaconf imported outside lrlhf.run: {found}"


def test_one_name_per_thing():
    names: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):  # Python's own names for a package and its command
            names.setdefault(path.name, []).append(str(path.relative_to(SRC)))
    repeated = {n: sorted(p) for n, p in names.items() if len(p) > 1 and n not in SHARED_NAMES}
    assert not repeated, f"one file name for several things (rename, or name it in docs/architecture.md): {repeated}"
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## One name per thing"):]
    assert all(re.search(rf"`{re.escape(n)}`", section) for n in SHARED_NAMES), "name each shared file name in the doc"


def test_no_file_over_500_lines():
    root = SRC.parents[1]
    long = {str(p.relative_to(root)): n for p in [*root.glob("src/**/*.py"), *root.glob("tests/**/*.py"),
                                                 *root.glob("bench/*.py"), root / "train.py"]
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"files over the house's 500 lines (split them): {long}"


def test_a_rollout_carries_its_products_not_the_module():
    """What a rollout produced (a reward's disagreement and components, the filter's statistics) travels on the
    Rollout, so selecting rows selects them all: no ``self.rollout_*`` / ``self.last_rollout`` side channel."""
    found = []
    for path in sorted((SRC / "modules").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and isinstance(node.ctx, ast.Store) and re.match(r"(last_)?rollout_|last_rollout", node.attr)):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} self.{node.attr}")
    assert not found, found
