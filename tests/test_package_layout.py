"""The package's imports run one way: no cycle among tfbigconv's modules (imports
inside functions included), no loop between its subpackages, and no module uses
another's private names. Read from the source with ast; nothing is imported."""
import ast
import os

import pytest

import tfbigconv

ROOT = os.path.dirname(os.path.abspath(tfbigconv.__file__))


def modules(root=ROOT):
    """{dotted name: path} of every module of the package under root (compiled ones
    too: they import nothing of the package)."""
    out = {}
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".so"):
                out["tfbigconv." + f.split(".")[0]] = None
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(root))
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


def import_graph(root=ROOT):
    """{module: {(imported module, line)}} for every module of the package under root."""
    known = modules(root)
    return {m: {(dep, line) for dep, _, line in imports(m, p, known) if dep != m} if p else set()
            for m, p in known.items()}


def find_cycle(graph):
    """A cycle [a, b, ..., a] in {node: set of nodes}, or None."""
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        path.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def unit(module):
    """A module's place at package level: its subpackage of tfbigconv (tfbigconv.keras
    for tfbigconv.keras.layers), or itself for a top-level module (tfbigconv.host)."""
    return ".".join(module.split(".")[:2])


def package_loop(graph):
    """A loop between tfbigconv's subpackages (and top-level modules), even where the
    modules inside them form no cycle, e.g. keras/__init__ -> fusion/layers ->
    keras/layers; with the imports that make each step. None if there is none."""
    why = {}
    for m, deps in graph.items():
        for dep, line in deps:
            if unit(dep) != unit(m):
                why.setdefault((unit(m), unit(dep)), f"{m}:{line} imports {dep}")
    loop = find_cycle({u: {b for a, b in why if a == u} for u in {unit(m) for m in graph}})
    return loop and " -> ".join(loop) + " (" + "; ".join(
        why[a, b] for a, b in zip(loop, loop[1:])) + ")"


def test_no_import_cycle():
    graph = {m: {dep for dep, _ in deps} for m, deps in import_graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    assert len(graph) > 20  # the walk saw the package


def test_no_import_loop_between_subpackages():
    """Imports between subpackages run one way too: a module-level cycle is not needed
    for a loop (keras -> fusion -> keras worked only because tfbigconv/__init__.py
    imported keras first)."""
    graph = import_graph()
    loop = package_loop(graph)
    assert loop is None, "package-level import loop: " + loop
    assert len({unit(m) for m in graph}) > 10  # the walk saw the subpackages


def test_the_loop_check_finds_a_loop():
    """package_loop on a made-up graph where two subpackages import each other through
    different modules (no module-level cycle)."""
    graph = {"tfbigconv.a": {("tfbigconv.b.y", 3)}, "tfbigconv.a.x": {("tfbigconv.c", 1)},
             "tfbigconv.b.y": {("tfbigconv.a.x", 7)}, "tfbigconv.c": set(), "tfbigconv.b": set()}
    assert find_cycle({m: {d for d, _ in deps} for m, deps in graph.items()}) is None
    assert package_loop(graph) == ("tfbigconv.a -> tfbigconv.b -> tfbigconv.a "
                                   "(tfbigconv.a:3 imports tfbigconv.b.y; "
                                   "tfbigconv.b.y:7 imports tfbigconv.a.x)")


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
