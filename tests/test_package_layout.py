"""The package's imports run one way: every import, at module level or inside a
function, goes to the module's own layer or one below (LAYERS, docs/ARCHITECTURE.md
2.1); no cycle among tfbigconv's modules (imports inside functions included); no
loop between its subpackages; no import of the package inside a function but the
compiled modules'; and no module uses another's private names. Read from the
source with ast; nothing is imported."""
import ast
import os

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


def in_functions(path):
    """The lines of the import statements inside function bodies (nested ones too)."""
    tree = ast.parse(open(path).read(), path)
    return {node.lineno for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for node in ast.walk(f) if isinstance(node, (ast.Import, ast.ImportFrom))}


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


# The package's layers, lowest first (docs/ARCHITECTURE.md, 2.1): each module's layer
# is that of the longest name here that it is or lies under.
LAYERS = (
    ("compiled", ("tfbigconv._core", "tfbigconv._bigconv_ops", "tfbigconv._build_info")),
    ("foundation", ("tfbigconv.version", "tfbigconv.errors", "tfbigconv.host",
                    "tfbigconv.timer", "tfbigconv.arguments", "tfbigconv.capabilities", "tfbigconv._native",
                    "tfbigconv._missing", "tfbigconv.large_kernels", "tfbigconv.text",
                    "tfbigconv.keras_model")),
    ("TF's kernels", ("tfbigconv.kernels", "tfbigconv.pure_tf")),
    ("cost model", ("tfbigconv.cost_model",)),
    ("planning", ("tfbigconv.planning",)),
    ("ops", ("tfbigconv.ops",)),
    ("features", ("tfbigconv.keras", "tfbigconv.fusion", "tfbigconv.memory",
                  "tfbigconv.routing")),
    ("entry points", ("tfbigconv.cli", "tfbigconv.__main__", "tfbigconv")),
)

# The compiled modules may be missing (a source tree, an export without the library):
# pure_tf/, imported before tfbigconv/__init__.py puts stand-ins in their place,
# imports _core where it calls it. Only these may be imported inside a function.
COMPILED = ("tfbigconv._core", "tfbigconv._native")


def layer_of(module):
    """(index in LAYERS, name) of `module`'s layer, or None if LAYERS has none."""
    found = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".")]
    return found and (max(found)[1], LAYERS[max(found)[1]][0]) or None


def upward_imports(graph):
    """["m:line (layer) imports dep (higher layer)"] for each import in
    {module: {(imported module, line)}} that runs up the layers."""
    return [f"{m}:{line} ({layer_of(m)[1]}) imports {dep} ({layer_of(dep)[1]})"
            for m, deps in sorted(graph.items()) for dep, line in sorted(deps)
            if layer_of(dep)[0] > layer_of(m)[0]]


def test_every_module_has_a_layer():
    missing = [m for m in modules() if layer_of(m) is None]
    assert not missing, f"modules in no layer of LAYERS: {missing}"


def test_imports_run_down_the_layers():
    """Module level and inside functions alike."""
    graph = import_graph()
    assert not upward_imports(graph)
    assert len(graph) > 20  # the walk saw the package


def test_the_layer_check_finds_an_upward_import():
    graph = {"tfbigconv.kernels": {("tfbigconv.planning.planner", 12)},
             "tfbigconv.planning.planner": {("tfbigconv.kernels", 3)}}
    assert upward_imports(graph) == ["tfbigconv.kernels:12 (TF's kernels) imports "
                                     "tfbigconv.planning.planner (planning)"]


def imports_in_functions(known):
    """["m:line imports dep"] for each import of the package inside a function of a
    module of `known` ({dotted name: path}), but of the compiled modules."""
    return [f"{m}:{line} imports {dep}" for m, path in sorted(known.items()) if path
            for dep, _, line in imports(m, path, known)
            if line in in_functions(path) and dep not in COMPILED]


def test_no_package_imports_inside_functions():
    """An import inside a function hides a dependency, or works around a cycle: the
    package's imports are at module level, but for the compiled modules (COMPILED)."""
    hidden = imports_in_functions(modules())
    assert not hidden, hidden


def test_the_function_check_finds_an_import_in_a_function(tmp_path):
    (tmp_path / "a.py").write_text("from tfbigconv import _core, b\n\n\n"
                                   "class A:\n    def f(self):\n"
                                   "        g = lambda: __import__('os')\n"
                                   "        from tfbigconv import _native, b\n"
                                   "        import tfbigconv.b\n        return g\n")
    known = {"tfbigconv.a": str(tmp_path / "a.py"), "tfbigconv.b": None,
             "tfbigconv._core": None, "tfbigconv._native": None}
    assert imports_in_functions(known) == ["tfbigconv.a:7 imports tfbigconv.b",
                                           "tfbigconv.a:8 imports tfbigconv.b"]


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
