"""The package's modules import each other without a cycle, and only
jax_rmsnorm/_compat.py reaches into JAX's private modules.

The import graph is read from the sources (every import statement, those
inside functions too), so a cycle that a deferred import hides at load time
still fails here."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jax_rmsnorm"


def _module_name(path):
    parts = ("jax_rmsnorm",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, name):
    """The absolute names a module imports (``from . import x`` as ``package.x``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def import_graph():
    """{module: the package's modules it imports}; a module's own package
    (the __init__ that Python runs first anyway) does not count as an edge."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        parents = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
        graph[name] = sorted(m for m in _imports(path, name) if m in files and m != name and m not in parents)
    return graph


def find_cycle(graph):
    """A list of modules that import each other in a ring, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_import_graph_is_acyclic():
    graph = import_graph()
    assert {"jax_rmsnorm._api", "jax_rmsnorm._fused", "jax_rmsnorm._checks"} <= set(graph), graph
    assert "jax_rmsnorm._checks" in graph["jax_rmsnorm._fused"] and "jax_rmsnorm._checks" in graph["jax_rmsnorm._api"]
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_find_cycle_finds_one():
    # The check itself: a ring through a deferred import is reported.
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b", "c"], "b": ["c"], "c": []}) is None


def test_relative_imports_resolve(tmp_path):
    pkg = tmp_path / "jax_rmsnorm"
    (pkg / "flax").mkdir(parents=True)
    nnx = pkg / "flax" / "nnx.py"
    nnx.write_text("from .._modules import normalize\nfrom . import other\nimport jax\n")
    assert _imports(nnx, "jax_rmsnorm.flax.nnx") == {
        "jax_rmsnorm._modules", "jax_rmsnorm._modules.normalize", "jax_rmsnorm.flax", "jax_rmsnorm.flax.other", "jax"}


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_private_jax_only_in_compat(path):
    if path.name == "_compat.py":
        return
    private = sorted(m for m in _imports(path, _module_name(path)) if m == "jax._src" or m.startswith("jax._src."))
    assert not private, f"{path.name} imports {private}: JAX's internals belong in _compat.py"
