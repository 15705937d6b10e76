"""One forward path (issue 28): the `ModelRunner` is the only code that calls the model.

An AST scan of the product's code (shared/headstart, services/, the
command's cli/) and of the benchmarks (bench/) for what runs a Hugging Face
model, or part of it, from outside `engine/runner/model_runner.py`:

- a call of the model itself, with its inputs: `model(...)`, `self.model(...)`,
  `runtime.model(...)`, `loaded.model(...)`, the decoder `model.model(...)`,
  a name bound to one of those (`m = loaded.model; m(...)`), `model.__call__(...)`;
- `.forward(...)` on anything (but `super().forward(...)` inside a module's own forward);
- `.generate(...)` on a model, or with Hugging Face generation arguments;
- a decoder layer run by itself: `model.model.layers[i](...)`;
- a forward hook: `register_forward_hook`, `register_forward_pre_hook`
  (and torch's global `register_module_forward_(pre_)hook`), which would hang
  behaviour on the model where no reader of the runner finds it.

The runner's packed decoder loop lives in `engine/runner/decoder_loop.py`: it
runs the model's modules (embedding, rotary, norms, through the runner's
ops) but no call above, and only the runner may import it (PACKED), so it
is the runner's forward in a file of its own, not a second way in.

The few sites that call the model on purpose, outside the runner, are listed
in ALLOWED with the reason; an allowance that no longer matches a call fails
too, so the list cannot go stale. Tests are not scanned: they compare the
runner with the model's own forward.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("shared/headstart", "services", "bench", "cli")  # cli/: the command's own package, where it exists
RUNNER = "shared/headstart/engine/runner/model_runner.py"
PACKED = "headstart.engine.runner.decoder_loop"  # the runner's packed loop: imported by the runner alone

# (file, enclosing function) -> why it calls the model outside the runner
ALLOWED = {
    ("bench/memory_padded.py", "padded_extend_rows"):
        "the padded batched forward the runner replaced, kept as `bench memory`'s baseline",
    ("bench/peer_divergence.py", "our_steps"):
        "the reference beside llama.cpp: the model's own forward over the whole sequence, teacher-forced",
    ("bench/peer_divergence.py", "compare"):
        "the same reference's greedy tokens (the engine's own are `engine_cold`, beside them)",
    # the GPU check's floors: one decode step of the model's own forward apart from the engine
    ("bench/gpu_floor.py", "hf_dynamic"): "the floor on a DynamicCache: its prefill",
    ("bench/gpu_floor.py", "step"): "the floors' decode steps (DynamicCache, StaticCache)",
    ("bench/gpu_floor.py", "_static_prefill"): "the floor on a StaticCache: its prefill",
    ("bench/gpu_floor.py", "forward"): "the step captured in a CUDA graph",
}

MODEL_NAMES = {"model"}  # a bare name that holds a model
MODEL_ATTRS = {"model", "_model"}  # `x.model`: a runtime's, a loaded model's, a runner's, the decoder
HOOKS = {"register_forward_hook", "register_forward_pre_hook",
         "register_module_forward_hook", "register_module_forward_pre_hook"}
GENERATE_KWARGS = {"input_ids", "max_new_tokens", "generation_config", "attention_mask", "do_sample", "streamer"}


class _Finder(ast.NodeVisitor):
    """Collects (line, innermost enclosing function, what) of every model call in one module."""

    def __init__(self, aliases: set[str]):
        self.aliases = aliases
        self.scope: list[str] = []
        self.found: list[tuple[int, str, str]] = []

    def _enter_function(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _enter_function

    def visit_Call(self, node: ast.Call):
        what = _model_call(node, self.aliases)
        if what is not None:
            self.found.append((node.lineno, self.scope[-1] if self.scope else "<module>", what))
        self.generic_visit(node)


def _is_model(node: ast.AST, aliases: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in MODEL_NAMES or node.id in aliases
    return isinstance(node, ast.Attribute) and node.attr in MODEL_ATTRS


def _model_call(call: ast.Call, aliases: set[str]) -> str | None:
    """What `call` runs of a model (a short description), or None."""
    func = call.func
    if _is_model(func, aliases) and (call.args or call.keywords):  # a model's forward takes its input ids
        return f"{ast.unparse(func)}(...)"
    if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute) and func.value.attr == "layers":
        return f"{ast.unparse(func)}(...): a decoder layer"
    if not isinstance(func, ast.Attribute):
        return None
    receiver = func.value
    if func.attr in HOOKS:
        return f".{func.attr}(...)"
    if func.attr == "__call__" and _is_model(receiver, aliases):
        return f"{ast.unparse(func)}(...)"
    if func.attr == "forward":
        is_super = isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) \
            and receiver.func.id == "super"
        return None if is_super else f"{ast.unparse(func)}(...)"
    if func.attr == "generate" and (_is_model(receiver, aliases)
                                    or any(k.arg in GENERATE_KWARGS for k in call.keywords)):
        return f"{ast.unparse(func)}(...)"
    return None


def _aliases(tree: ast.AST) -> set[str]:
    """Names bound to a model in this module (`m = loaded.model`, `model, runner = rt.model, rt.runner`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts))
            found |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _is_model(v, set())}
    return found


def model_calls(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function, what) of every model call in `source`."""
    tree = ast.parse(source)
    finder = _Finder(_aliases(tree))
    finder.visit(tree)
    return finder.found


def _scan() -> dict[tuple[str, str], list[str]]:
    """Every model call of the scanned code, by (file, enclosing function)."""
    out: dict[tuple[str, str], list[str]] = {}
    for root in SCANNED:
        for path in sorted((ROOT / root).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            for line, function, what in model_calls(path.read_text()):
                out.setdefault((name, function), []).append(f"{name}:{line} in {function}: {what}")
    return out


def test_only_the_model_runner_calls_the_model():
    """Outside engine/runner/model_runner.py only the ALLOWED sites call the model."""
    outside = {site: lines for site, lines in _scan().items() if site[0] != RUNNER and site not in ALLOWED}
    assert not outside, "call the model through the ModelRunner (engine/runner/model_runner.py):\n" + "\n".join(
        line for lines in outside.values() for line in lines)


def test_every_allowed_site_still_calls_the_model():
    """An allowance whose call is gone is deleted, not kept."""
    assert not set(ALLOWED) - set(_scan())


def test_the_runner_has_one_forward_path():
    """The runner itself calls no Hugging Face forward and hangs no hook:
    every forward it runs (extensions, packed rows, table-block precompute)
    is its packed decoder loop, the one file that runs the model's modules."""
    assert model_calls((ROOT / RUNNER).read_text()) == []
    assert model_calls((ROOT / "shared/headstart/engine/runner/decoder_loop.py").read_text()) == []
    assert PACKED in _imports((ROOT / RUNNER).read_text())


def _imports(source: str) -> set[str]:
    """The modules `source` imports (`from a.b import c` gives a.b and a.b.c)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_only_the_runner_imports_its_packed_loop():
    """`engine/runner/decoder_loop.py` is reached through `ModelRunner.extend_rows` alone."""
    importers = {path.relative_to(ROOT).as_posix() for root in SCANNED for path in sorted((ROOT / root).rglob("*.py"))
                 if PACKED in _imports(path.read_text())}
    assert importers == {RUNNER}


@pytest.mark.parametrize("source,what", [
    ("out = model(input_ids=ids, use_cache=True)", "model(...)"),
    ("def f(self, ids):\n    return self.model(ids)", "self.model(...)"),
    ("logits = runtime.model(ids).logits", "runtime.model(...)"),
    ("logits = runtime.loaded.model(ids).logits", "runtime.loaded.model(...)"),
    ("hidden = model.model(input_ids=ids).last_hidden_state", "model.model(...)"),
    ("out = self._model(ids)", "self._model(...)"),
    ("m = loaded.model\nout = m(ids)", "m(...)"),
    ("net, runner = runtime.model, runtime.runner\nnet(ids)", "net(...)"),
    ("out = model.__call__(ids)", "model.__call__(...)"),
    ("out = model.forward(input_ids=ids)", "model.forward(...)"),
    ("out = layer.self_attn.forward(hidden)", "layer.self_attn.forward(...)"),
    ("out = model.generate(ids, max_new_tokens=8)", "model.generate(...)"),
    ("out = runtime.loaded.model.generate(ids)", "runtime.loaded.model.generate(...)"),
    ("out = anything.generate(input_ids=ids)", "anything.generate(...)"),
    ("h = model.model.layers[0](hidden)", "model.model.layers[0](...): a decoder layer"),
    ("module.register_forward_hook(hook)", ".register_forward_hook(...)"),
    ("layer.register_forward_pre_hook(hook, with_kwargs=True)", ".register_forward_pre_hook(...)"),
    ("torch.nn.modules.module.register_module_forward_hook(hook)", ".register_module_forward_hook(...)"),
])
def test_the_guard_finds_a_model_call(source, what):
    assert [found for _, _, found in model_calls(source)] == [what]


@pytest.mark.parametrize("source", [
    "loaded = load_model(spec, dtype)",
    "entry = catalogue_model(name)",
    "runner.extend(state, ids)",
    "encoded = runtime.runner.encode_rows(rows)",
    "generation = generator.generate(question)",
    "logits = self.model.lm_head(rows)",
    "hidden = decoder.embed_tokens(ids)",
    "cos, sin = model.model.rotary_emb(probe, positions)",
    "n = len(model.model.layers)",
    "class Q(torch.nn.Module):\n    def forward(self, x):\n        return super().forward(x)",
    "async def generate():\n    pass\nawait generate()",
    "body = {'model': self.model(), 'stream': True}",  # a client's model id (loadtest), not a forward
])
def test_the_guard_leaves_other_calls_alone(source):
    assert model_calls(source) == []
