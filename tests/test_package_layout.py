"""The package's imports run one way: no cycle among tfbigconv's modules (imports
inside functions included), and no module uses another's private names. Read
from the source with ast; nothing is imported."""
import ast
import os

import pytest

import tfbigconv

ROOT = os.path.dirname(os.path.abspath(tfbigconv.__file__))


def modules():
    """{dotted name: path} of every module of the installed package (compiled ones
    too: they import nothing of the package)."""
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".so"):
                out["tfbigconv." + f.split(".")[0]] = None
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(ROOT))
                name = rel[:-3].replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = \
                    os.path.join(folder, f)
    return out


def imports(name, path, known):
    """[(imported module, names taken from it, line)] of one module, function bodies too.
    `from a import b` where a.b is a module imports a.b."""
    tree = ast.parse(open(path).read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:
                    out.append((sub, [], node.lineno))
                elif base in known:
                    out.append((base, [a.name], node.lineno))
    return out


def test_no_import_cycle():
    known = modules()
    graph = {m: {dep for dep, _, _ in imports(m, p, known) if dep != m} if p else set()
             for m, p in known.items()}
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == "open":
                cycle = path[path.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert len(graph) > 20  # the walk saw the package


def test_no_private_names_across_modules():
    """`from tfbigconv.x import _y` and `x._y` on an imported tfbigconv module
    reach into another module's internals. The compiled modules _core and
    _native are private modules with public names, so importing them is fine."""
    known = modules()
    bad = []
    for m, path in known.items():
        if path is None:
            continue
        tree = ast.parse(open(path).read(), path)
        aliases = {}
        for dep, names, line in imports(m, path, known):
            bad += [f"{m}:{line} takes {dep}.{n}" for n in names
                    if n.startswith("_") and not n.startswith("__") and n not in ("_core",)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    "tfbigconv"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in known:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in known and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and aliases[node.value.id] != m
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{m}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not bad, bad


def test_public_modules_keep_their_names():
    """tfbigconv.fuse and tfbigconv.fuse_train were modules before the package was
    layered; code that imports them by those names still works."""
    import importlib
    fuse = importlib.import_module("tfbigconv.fuse")
    fuse_train = importlib.import_module("tfbigconv.fuse_train")
    assert fuse is tfbigconv.fuse and fuse_train is tfbigconv.fuse_train
    from tfbigconv.fuse import compose_program  # noqa: F401
    from tfbigconv.fuse_train import choose_mode  # noqa: F401
