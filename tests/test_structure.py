"""The shape the code keeps: one list (the config groups), short modules, imports that flow one way."""

import ast
import re
import tokenize

from omegaconf import OmegaConf

from .conftest import ROOT

PACKAGE = ROOT / "dpgrid"
SOURCES = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))


def strategy_names() -> set:
    return {str(OmegaConf.load(p).name) for p in (ROOT / "conf" / "strategy").glob("*.yaml")}


def string_literals(path):
    with open(path, "rb") as f:
        for token in tokenize.tokenize(f.readline):
            if token.type == tokenize.STRING:
                try:
                    yield token.start[0], ast.literal_eval(token.string)
                except (ValueError, SyntaxError):  # f-strings
                    yield token.start[0], token.string


def test_no_strategy_is_named_outside_its_own_module():
    """A strategy is one module and one config: its name as a string literal anywhere else in dpgrid or
    scripts/ would be a hand-kept list (tests name strategies on purpose and are exempt)."""
    names = strategy_names()
    found = []
    for path in SOURCES:
        for line, value in string_literals(path):
            if isinstance(value, str) and value in names and path.stem != value:
                found.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert not found, found


# A module is as long as its one concern needs; one over 300 lines says here why it is one concern, and none grows
# past 450 (then it holds two).
LONG_MODULES = {
    "dpgrid/training/persample.py": "the two per-sample engines (torch.func's and the fast one) and the choice between "
                                    "them: one contract, PerSampleGrads, served two ways",
    "dpgrid/training/proof.py": "the fast engine's proof on the first batch: where the samples are, the exact reference "
                                "and the comparison (the choice it leads to: dpgrid.training.choice)",
    "dpgrid/runner.py": "one grid's training, from the loaded data to the committed rows",
    "dpgrid/commands/cli.py": "the command line: each command's arguments, and every refusal turned into its one line and exit "
                     "code",
}


def test_modules_stay_short():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}
    assert set(long) <= set(LONG_MODULES), {k: v for k, v in long.items() if k not in LONG_MODULES}
    assert all(n <= 450 for n in long.values()), long


def imports(path) -> set:
    """The dpgrid modules a module imports, at any depth of the file (lazy imports count too)."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            if base.startswith("dpgrid"):
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dpgrid"))
    return found


def test_no_import_cycles():
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py") if "conf" not in p.parts}
    graph = {m: {i for i in imports(p) if i in modules and i != m and i != "dpgrid"} for m, p in modules.items()}
    for package in [m for m, p in modules.items() if p.name == "__init__.py" and m != "dpgrid"]:
        graph[package] -= {m for m in modules if m.startswith(package + ".")}  # a package re-exports its modules
    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None
    cycles = [c for m in graph if (c := cycle_from(m))]
    assert not cycles, cycles[0]


def test_every_config_folder_is_installed():
    """A plain `pip install .` ships conf/ as dpgrid.conf: a config group missing from pyproject's package list
    would work from a checkout and vanish from an install."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(("dpgrid", *p.parent.relative_to(ROOT).parts)) for p in (ROOT / "conf").rglob("*.yaml")}
    assert folders <= listed, folders - listed


def test_every_package_is_installed():
    """pyproject lists dpgrid's packages by name: a new subpackage missing there imports from a checkout (and an
    editable install) and is absent from `pip install .`, which the CI and a user's machine run."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert packages <= listed, packages - listed


def functions(path):
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.FunctionDef,
                                                                                       ast.AsyncFunctionDef))]


def test_few_functions_read_the_whole_config():
    """Compile, then run: the whole config is read by compile and the entry points around it (at most 8
    functions); everything after receives the frozen GridSpec or plain values."""
    takers = [f"{path.relative_to(ROOT)}:{f.name}" for path in sorted(PACKAGE.rglob("*.py")) for f in functions(path)
              if any(a.arg == "cfg" for a in f.args.args + f.args.kwonlyargs)]
    assert len(takers) <= 8, takers


def test_no_hidden_process_state():
    """No result cache, no Hydra internals, no hook found by hasattr, no registration at import but the layer rules'
    class decorators (@register_rule: the fast engine's registry, keyed by layer type, as Opacus's grad samplers;
    test_layer_types_are_dispatched_by_the_registry_alone)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        for bad in ("lru_cache", "functools.cache", "hydra._internal", "hasattr(strategy", "_warned"):
            if bad in text:
                found.append(f"{path.relative_to(ROOT)}: {bad}")
        for node in tree.body:  # module level: only definitions, imports, constants and docstrings
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not import_effect(path, node):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: a call at import time")
    assert not found, found


# The one effect an import has: `import dpgrid` lets last release's module paths import (dpgrid.MOVED_MODULES), so
# that `import dpgrid.transformers` says where the module went instead of raising ModuleNotFoundError.
IMPORT_EFFECTS = {"dpgrid/__init__.py": "_install_moved_modules()"}


def import_effect(path, node) -> bool:
    return IMPORT_EFFECTS.get(str(path.relative_to(ROOT))) == ast.unparse(node)


def test_layer_types_are_dispatched_by_the_registry_alone():
    """A parametrised layer type is named in its rule's module (dpgrid/training/rules/) and nowhere else in the
    engines: no isinstance or type() test on torch's parametrised layers outside it; the registry is written by the
    register_rule decorator alone."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "rules" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "issubclass", "type"):
                named = {ast.unparse(n).removeprefix("nn.").removeprefix("torch.nn.") for n in ast.walk(node)
                         if isinstance(n, (ast.Attribute, ast.Name))}
                if named & PARAMETRISED:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "RULES" and \
                    isinstance(getattr(node, "ctx", None), ast.Store):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: writes the registry")
    assert not found, found
    from dpgrid.training.rules import RULES

    assert {cls.__name__ for cls in RULES} >= {"Linear", "Conv1d", "Conv2d", "ConvTranspose2d", "Embedding", "LayerNorm",
                                             "RMSNorm", "GroupNorm", "InstanceNorm2d"}


PARAMETRISED = {"Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                "ConvTranspose3d", "Embedding", "EmbeddingBag", "LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm1d",
                "InstanceNorm2d", "InstanceNorm3d", "MultiheadAttention", "PReLU", "LSTM", "GRU", "RNN"}


def test_the_plan_and_the_spec_are_frozen():
    import dataclasses

    from dpgrid.config import GridSpec, Training
    from dpgrid.privacy import Plan

    assert all(cls.__dataclass_params__.frozen for cls in (GridSpec, Training, Plan))
    assert dataclasses.fields(GridSpec)



def method_branches(source: str, where: str, names) -> list:
    """Comparisons with an accounting method's name, and a method's own plan field read as a condition
    (`if plan.schedule`, `... if plan.selection else`): branches on which method a grid has."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for part in [node.left, *node.comparators]:
                if isinstance(part, ast.Constant) and part.value in names:
                    found.append(f"{where}:{node.lineno}: compared with {part.value!r}")
        tests = node.values if isinstance(node, ast.BoolOp) else \
            [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
        for test in tests:
            if isinstance(test, ast.Attribute) and test.attr in METHOD_FIELDS:
                found.append(f"{where}:{node.lineno}: branches on .{test.attr}")
            if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == "get" and \
                    test.args and isinstance(test.args[0], ast.Constant) and test.args[0].value in METHOD_FIELDS:
                found.append(f"{where}:{node.lineno}: branches on .get({test.args[0].value!r})")
    return found


METHOD_FIELDS = ("schedule", "selection", "tuning", "budget")  # a built-in method's own fields of a plan


def test_the_runner_and_the_results_ask_the_accounting_method():
    """What a grid trains, what its rows add, what it releases and how `dpgrid plan` describes it are its accounting
    method's answers (dpgrid.privacy.method): the runner, the results, the reporting (the plan's description, the
    console, the tables and figures), the spec and the command line hold no branch on a method's name. The files
    of random stopping (results/selection.py) and of tuning on a subsample (results/tuning.py) are those methods'
    own implementation and exempt."""
    from dpgrid.privacy import ACCOUNTING

    names = set(ACCOUNTING)
    # the walk finds the branches it looks for
    assert len(method_branches("if plan.selection == 'random_stopping': pass\nx = 1 if plan.schedule else 2\n"
                               "y = f(p) if plan.get('tuning') else p\n", "example", names)) == 3
    modules = [PACKAGE / "runner.py", *sorted((PACKAGE / "results").glob("*.py")), PACKAGE / "commands" / "cli.py", PACKAGE / "api.py",
               *sorted((PACKAGE / "reporting").glob("*.py")), PACKAGE / "config" / "compile.py",
               PACKAGE / "config" / "identity.py", PACKAGE / "commands" / "launchers.py"]
    found = [f for path in modules if path.name not in ("selection.py", "tuning.py")
             for f in method_branches(path.read_text(), str(path.relative_to(ROOT)), names)]
    assert not found, found


# What each subpackage may not import (anywhere in its code, at the top or in a function): nothing below the entry
# points reaches up to them, and the parts that run a grid do not reach into how it is composed or tabled.
FORBIDDEN_IMPORTS = {
    "strategies": ("dpgrid.config", "dpgrid.results", "dpgrid.reporting", "dpgrid.reproduction", "dpgrid.runner"),
    "training": ("dpgrid.config", "dpgrid.results", "dpgrid.reporting", "dpgrid.reproduction", "dpgrid.runner",
                 "dpgrid.strategies"),
    "privacy": ("dpgrid.config.compile", "dpgrid.config.compose", "dpgrid.reporting", "dpgrid.reproduction",
                "dpgrid.runner", "dpgrid.results"),  # the maths import nothing of the files
    "results": ("dpgrid.config.compile", "dpgrid.config.compose", "dpgrid.config.checks", "dpgrid.reporting",
                "dpgrid.reproduction", "dpgrid.runner"),
    "reporting": ("dpgrid.config.compile", "dpgrid.runner"),
    "config": ("dpgrid.results", "dpgrid.reporting", "dpgrid.reproduction", "dpgrid.runner"),
    "reproduction": ("dpgrid.runner", "dpgrid.reporting"),
}
ENTRY_POINTS = ("dpgrid.commands", "dpgrid.api")  # the command line, Hydra's jobs and launchers; a notebook's calls


def upward_imports(path, forbidden) -> list:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)] \
            if isinstance(node, ast.ImportFrom) and node.module else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        bad = next((n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)), None)
        if bad:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {bad}")
    return found


def test_no_import_points_back_up():
    """strategies -> config.checks, results -> config.compile and the like: a subpackage imports only what lies
    below it (the table above), and nothing but the entry points imports the entry points (top-level modules such
    as dpgrid.testing and dpgrid.runner included; `python -m dpgrid` and the package's lazy names aside)."""
    assert upward_imports(PACKAGE / "api.py", ("dpgrid.config",)), "the walk finds the imports it looks for"
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts
        module = "dpgrid." + ".".join(part).removesuffix(".py")
        exempt = any(module == e or module.startswith(e + ".") for e in ENTRY_POINTS) or \
            module in ("dpgrid.__main__", "dpgrid.__init__")
        forbidden = (*FORBIDDEN_IMPORTS.get(part[0], ()), *(() if exempt else ENTRY_POINTS))
        found += upward_imports(path, forbidden)
    assert not found, found


def import_graph() -> dict:
    """{unit: the units it imports anywhere (at the top or in a function)}, a unit being a top-level module or a
    subpackage of dpgrid (dpgrid.runner, dpgrid.training); the package itself (DpgridError, the lazy names) aside."""
    units = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts
        unit = f"dpgrid.{part[0].removesuffix('.py')}"
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)] \
                if isinstance(node, ast.ImportFrom) and node.module and not node.level else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith("dpgrid.") and (PACKAGE / name.split(".")[1]).exists() or \
                        name.startswith("dpgrid.") and (PACKAGE / f"{name.split('.')[1]}.py").exists():
                    other = ".".join(name.split(".")[:2])
                    if other != unit:
                        units.setdefault(unit, set()).add(other)
    return units


def test_no_circle_among_modules_and_subpackages():
    """No unit (a top-level module or a subpackage) reaches itself through the imports of others, counting imports
    made inside functions: a reader can take the units in an order where each uses only what came before."""
    graph = import_graph()
    assert graph["dpgrid.runner"] >= {"dpgrid.training", "dpgrid.strategies"}, "the graph holds the imports"
    order, state = [], {}

    def visit(unit, path):
        if state.get(unit) == "done":
            return
        assert state.get(unit) != "open", " -> ".join([*path[path.index(unit):], unit])
        state[unit] = "open"
        for other in sorted(graph.get(unit, ())):
            visit(other, [*path, unit])
        state[unit] = "done"
        order.append(unit)

    for unit in sorted(graph):
        visit(unit, [])


MODULE_CONSTRUCTORS = ("re.compile", "tuple", "contextvars.ContextVar", "lazy_import", "np.concatenate", "np.arange",
                       "np.unique", "Adjacency")  # what a module may call to build a constant at import (a frozen
                                                  # dataclass's constructor only stores its fields)


def test_importing_a_module_changes_nothing_outside_it():
    """At import a module defines its names and nothing else: no call for its effect, no assignment into another
    object (sys.modules, os.environ, a library's settings), constants built by pure constructors only."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not import_effect(path, node):
                found.append(f"{where}: a call for its effect")
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if isinstance(node, ast.AugAssign) or any(not isinstance(t, (ast.Name, ast.Tuple)) for t in targets):
                    found.append(f"{where}: assigns into another object")
                if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) not in MODULE_CONSTRUCTORS:
                    found.append(f"{where}: calls {ast.unparse(node.value.func)} at import")
    assert not found, found


def test_checking_a_config_loads_no_torch_and_registers_no_module():
    """The strategies name torch at the top, loaded at its first use: checking a config (compile without a plan)
    leaves sys.modules without torch, not even a placeholder for it."""
    import subprocess
    import sys

    code = ("import sys, dpgrid\nfrom dpgrid.config import compile\n"
            "for o in ([], ['strategy=fixed_quantile'], ['strategy=pur', 'dataset=breast_cancer'],"
            " ['privacy.selection=subsample_tuning']):\n    compile(dpgrid.compose(o), plan=False)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_after_compile_no_function_receives_the_config(tmp_path):
    """Compile, then run: every dpgrid function called while a compiled grid trains, watched as it is called, and
    the arguments that are OmegaConf nodes named: none (the dataset and the model are typed specs by then)."""
    import sys

    from omegaconf import DictConfig

    import dpgrid
    from dpgrid.config import compile

    spec = compile(dpgrid.compose(["grid.k=2", "train.epochs=1", "train.seeds=1", "privacy.selection=random_stopping",
                                   "privacy.stopping_mean=2"]))
    found = set()

    def watch(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("dpgrid"):
            code = frame.f_code
            found.update(f"{module}.{code.co_qualname}({name})" for name in
                         code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
                         if isinstance(frame.f_locals.get(name), DictConfig))

    from dpgrid.specs import dataset_spec

    node = dpgrid.compose([]).dataset
    sys.setprofile(watch)
    try:
        dataset_spec(node)  # the watch sees a node passed (compile passes it so)
        seen, found = set(found), set()
        dpgrid.run_grid(spec, tmp_path / "grid", progress=False)
    finally:
        sys.setprofile(None)
    assert "dpgrid.specs.dataset_spec(node)" in seen and not found, (seen, found)


def test_no_strategy_branches_on_whether_it_is_stacked():
    """One step serves one run and G stacked runs: the base class's helpers (per_run, dot, normal, noisy_mean,
    flatten, clip_weights, descend) know the form; a strategy, built-in or an example's, never asks."""
    modules = [p for p in sorted((PACKAGE / "strategies").glob("*.py")) if p.name != "base.py"]
    modules += sorted((ROOT / "examples" / "dpgrid_example").glob("*.py"))
    found = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in modules for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "stacked"]
    assert len(modules) > 8 and not found, found


def test_one_training_loop():
    """Every run, alone or stacked, is trained by one loop (dpgrid.training.train.train_runs), and its steps are taken
    in one place (dpgrid.training.graphs.Steps: launched, or captured as a CUDA graph): no other function in dpgrid
    takes a strategy's step or makes the steps. The stacked engine's norms and sums are the layer rules' (the fast
    engine's) with a leading run dimension, not maths of its own."""
    steps, makers = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)]
            if any(isinstance(c.func, ast.Attribute) and c.func.attr == "step" and
                   ast.unparse(c.func.value) in ("strategy", "self.strategy") for c in calls):
                steps.append(f"{path.relative_to(ROOT)}:{node.name}")
            if any(ast.unparse(c.func) == "Steps" for c in calls):
                makers.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert steps == [f"dpgrid/training/graphs.py:{name}" for name in ("__call__", "launch", "capture")], steps
    assert makers == ["dpgrid/training/train.py:train_runs"], makers
    tree = ast.parse((PACKAGE / "training" / "stacked.py").read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StackedEngine")
    called = {ast.unparse(c.func) for c in ast.walk(engine) if isinstance(c, ast.Call)}
    assert "rule_for" in called and not called & {"torch.einsum", "torch.bmm", "torch.matmul"}, called


def public_members(cls) -> set:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_the_accounting_contract_is_small_and_the_procedure_is_documented():
    """An accounting method is its privacy maths alone (dp-accounting's events are data, Opacus's accountant base has
    four members): at most twelve public members (its keys and record, its accountants, calibrate, the steps a release's
    epsilon composes, and what its epsilon covers, for which neighbours, whether it composes the seeds and a model's
    private statistics, which procedure), none of them about files, rows or text; what a grid trains and
    releases is its procedure's, a separate interface whose every member docs/extending.md documents. No member
    exists for one built-in method only where the plan's data says it (a noise per run, configurations described)."""
    from dpgrid.privacy.method import AccountingMethod
    from dpgrid.results.procedure import Procedure

    maths = public_members(AccountingMethod)
    assert len(maths) <= 12 and maths >= {"calibrate", "check_options", "name", "Options", "Record"}, maths
    assert not maths & public_members(Procedure), maths & public_members(Procedure)
    extending = (ROOT / "docs" / "extending.md").read_text()
    undocumented = [name for name in public_members(Procedure) | maths if f"`{name}" not in extending]
    assert not undocumented, undocumented
    from dpgrid.privacy import ACCOUNTING

    for method in ACCOUNTING.values():  # the built-in methods override the maths only; their procedures the rest
        assert public_members(method) <= maths | {"spent"}, (method.__name__, public_members(method) - maths)
    for gone in ("noise_per_run", "describes_configurations", "announcement", "unclaimed", "accounting"):
        assert not any(gone in public_members(cls) for cls in (AccountingMethod, Procedure, *ACCOUNTING.values())), gone


def test_one_meaning_per_name():
    """A name says one thing: a strategy's noise (dpgrid.strategies.Noise) is never a generator (a run's noise
    source), the accounting method is never a layer's per-sample method (per_sample_methods), one run_grid (the API's),
    the configurations a command trains are not a `selection`, the shims of older plugins are gone."""
    runner = (PACKAGE / "runner.py").read_text()
    assert not re.search(r"\bnoises\b|\bnoise\s*=\s*torch\.Generator", runner) and not re.search(r"\bmethods\b", runner)
    assert "def run_grid" not in runner and "attrs[" not in runner
    text = "".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    for gone in ("planned_runs", "Noise.of", "def multipliers", ".selected", "def accounting("):
        assert gone not in text, gone


# The command line's own modules: they turn a refusal into its line and exit code (signals: the handler of the
# command's first moment, before cli installs its own)
# the command line, and the tracker's worker (`python -m dpgrid.tracking.worker`: a process of its own, whose main()
# only its own process runs)
COMMAND_LINE = {"dpgrid/commands/cli.py", "dpgrid/__main__.py", "dpgrid/commands/signals.py", "dpgrid/tracking/worker.py"}


def test_library_code_never_exits():
    """Only the command line exits: everywhere else a refusal is a DpgridError (with its exit_code), so that a notebook
    or another program calling dpgrid gets an exception, never the end of its process."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if where in COMMAND_LINE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            called = node.func if isinstance(node, ast.Call) else None
            exits = (isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc)) \
                or (called is not None and ast.unparse(called) in ("sys.exit", "exit", "quit", "os._exit"))
            imports_cli = isinstance(node, ast.ImportFrom) and node.module == "dpgrid.commands.cli" or \
                isinstance(node, ast.ImportFrom) and node.module == "dpgrid" and any(a.name == "cli" for a in node.names)
            if exits or imports_cli:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, found
