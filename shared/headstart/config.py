"""Engine settings: one pydantic object built at the edge (CLI, env) and passed down.

Every field can be set from the environment with the `HEADSTART_` prefix
(e.g. `HEADSTART_MODEL=qwen2.5-coder-1.5b-instruct`).
"""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


# The cap on an answer's tokens where a command does not say (answers end at the model's EOS first:
# a Spider query with its code fence is ~15-60 tokens of the Qwen2.5 vocabulary).
MAX_ANSWER_TOKENS = 256


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEADSTART_", extra="forbid", protected_namespaces=())

    model: str = Field(DEFAULT_MODEL, description="a catalogue model (qwen2.5-coder-0.5b-instruct, "
                       "qwen2.5-coder-1.5b-instruct), a .gguf file, a local HF dir, a hub id, or random:<preset>")
    weights: Literal["auto", "quantized", "dequantized"] = Field(
        "auto", description="a GGUF model's weights: quantized (its own integers, the CPU kernels; auto on a CPU in "
        "float32) or dequantized (widened to --dtype: GPUs, other dtypes, the accuracy reference)")
    dtype: str = Field("float32", description="float32 | bfloat16 | float16 | float64")
    device: str = Field("cpu", description="cpu | cuda | cuda:N")
    threads: int | None = Field(None, description="torch intra-op threads (CPU); None = torch default")
    seed: int = Field(0, description="seed of random:<preset> weights")
    tokenizer_dir: Path | None = Field(None, description="tokenizer of random presets (default ../shared/models/...)")
    spider_dir: Path | None = Field(None, description="Spider data dir for db ids (default ../shared/data/spider)")
    p0_cache_dir: Path | None = Field(None, description="disk cache of P0 prefills (default <run dir>/p0cache)")
    p0_cache_on_disk: bool = Field(True, description="persist P0 caches across processes")
    max_sessions: int = Field(64, ge=1, description="sessions per process; idle ones are evicted LRU")
    kv_budget_bytes: int = Field(
        0, ge=0, description="KV cache bytes per replica (sessions + P0 caches); past it idle sessions are "
        "evicted LRU, then RESOURCE_EXHAUSTED (0: no byte bound)"
    )
    kv_session_reserve_tokens: int = Field(
        256, ge=0, description="private tokens a new session must find room for under kv_budget_bytes"
    )
    max_queued_jobs: int = Field(1024, ge=1, description="forward jobs queued before RESOURCE_EXHAUSTED")
    max_text_chars: int = Field(4000, ge=1, description="longest question text accepted")
    max_prompt_tokens: int = Field(8192, ge=16, description="prompt + new tokens limit per request")
    chunk_tokens: int = Field(256, ge=1, description="prefill chunk: the most a submit waits for typing work")
    max_batch_rows: int = Field(
        8, ge=1, description="jobs of different sessions whose forward passes run as one batch (1 = no batching)"
    )
    max_batch_tokens: int = Field(
        64, ge=1, description="new tokens in one batched forward; its first row always runs whatever its size (bounds a step)"
    )
    # On the 2-core CPU we measure on, a batched forward of 8 sessions' few
    # tokens costs about what one session's lone multi-token forward does,
    # so batching typing rows (which a new submit preempts) multiplies typing
    # throughput, and batching the answers' decode steps (continuous batching)
    # frees the time for it. Decode steps share the typing forwards
    # ("typing+decode"): with decode steps apart ("typing,decode") an answer
    # streaming while others type waited behind their typing forwards and
    # reached its last token later than without anticipation (docs/benchmarks-archive.md).
    batch_scope: Literal["typing", "typing,decode", "typing+decode", "all"] = Field(
        "typing+decode",
        description="which jobs may share a batch: typing prefill; and decode steps apart (,) or with it (+); every job",
    )
    decode_defer_ms: float = Field(
        1000.0, ge=0, description="a decode step that cannot share a typing forward waits behind typing prefill "
        "for at most this long (0: never)"
    )
    stream_typing_tokens: int = Field(
        32, ge=1, description="typing tokens in a forward that carries streaming answers' decode steps (room for "
        "one session's bulk of settled words or its finished prompt in one forward)"
    )
    # A typing row that rides with answers' decode steps costs them time on a
    # compute-bound CPU (~10-15 ms a token in a forward of a few tokens, the
    # 0.5B on 2 cores; ~6-7 among a dozen more), and the partial word and the
    # end of the turn it recomputes at every keystroke are cropped at the
    # next one: under that contention only settled words are committed, in
    # bulk, and the rest once the text reads as finished ("?") or rests
    # (issue 11's 8-typist totals).
    typing_settle_ms: float = Field(
        300.0, ge=0, description="while answers stream, a typing session commits its complete words only, and the "
        "rest of the prompt (partial word, end of turn) once its text ends a sentence (?, !, .) or has not changed "
        "for this long (0: always the whole prompt)"
    )
    typing_bulk_tokens: int = Field(
        16, ge=1, description="while answers stream, a typing session's settled words wait until this many tokens "
        "of them are new, then ride in one forward (a few tokens in each forward cost the answers more)"
    )
    # Measured per kernel choice by `headstart bench decode-step`.
    fast_path: Literal["off", "auto", "onednn", "native", "inductor", "quant"] = Field(
        "auto", description="kernels of every forward (all run the runner's decoder loop): off (the model's own "
        "modules) | onednn (packed matmuls, no compile) | native (headstart's own "
        "AVX-512 kernels for forwards of <= 48 tokens in float32, <= 8 in bfloat16, built with g++ at first start; "
        "oneDNN above; weights in huge pages; a float32 LM head screened through an int8 copy where the CPU has "
        "AVX512-VNNI, the greedy token unchanged) | inductor (torch.compile, minutes at start, cached on disk) | auto (off, onednn and native timed at "
        "start on this machine, a few s, the fastest kept; too loaded to time in 12 s: native where it builds, "
        "else float32 off, bfloat16 onednn; "
        "float64, tiny models and GPUs: off)"
    )
    batch_invariant: bool = Field(
        False, description="a batched row's logits bit-identical to its lone forward's (linear layers run per row: "
        "the weights are read once per row, not once per batch)"
    )
    malloc_trim_s: float = Field(
        30.0, ge=0, description="once its forward work pauses, a replica gives the heap pages glibc keeps free "
        "back to the system (malloc_trim) at most this often, in seconds (0: never; 2 s trims after every burst "
        "but cost a fifth of the complete SQL at 8 typists: docs/benchmarks.md, Replica RSS)"
    )
    trace_forwards: Path | None = Field(
        None, description="append one JSON line per forward-worker iteration to this file (jobs, tokens, time; "
        "for finding where latency goes under load; off when unset)"
    )
    debounce_ms: float = Field(300.0, ge=0, description="the paper policy's debounce")
    answer_ahead_tokens: int = Field(
        MAX_ANSWER_TOKENS, ge=0, description="greedy answer tokens decoded while the user pauses, up to the "
        "answer's end (0 = off)")
    candidates: int = Field(
        1, ge=1, le=16, description="answers decoded per request, the greedy one and candidates-1 sampled ones as "
        "rows of the same forwards; the checked answer is the SQL whose result most candidates share (1 = the "
        "greedy answer alone)")
    candidate_temperature: float = Field(0.7, gt=0, description="the sampled candidates' temperature")
    candidate_top_p: float = Field(1.0, gt=0, le=1, description="the sampled candidates' top-p")
    candidate_length_slack: int = Field(
        16, ge=0, le=1_000_000, description="a sampled candidate ends (\"bounded\", not run) past the greedy "
        "answer's length plus this many tokens, once the greedy answer has stopped (Spider dev: the checked answer "
        "as often right, the longest candidate 50 -> 40 tokens at the median); 1000000: no bound")
    draft_tokens: int | None = Field(
        None, ge=0, le=16, description="prompt-lookup draft tokens verified per greedy decode step (speculative "
        "decoding from the prompt: the same tokens, fewer forwards; the quantized kernels only). None: 1 at every "
        "kernel level (Spider dev's 972 answers: 1.17 tokens a forward, 5-7% less decode time; 2 tokens saved "
        "0-4%); 0: off")

    # -- table cache (papers/tablecache.md; headstart.tables) ------------------
    table_cache: Literal["off", "pfk", "independent"] = Field(
        "off", description="table blocks: off | pfk (foreign-key groups) | independent (each table alone)"
    )
    table_store_url: str = Field("memory://", description="block store: memory:// or redis://host:port/db")
    # -- data sessions (issue 12; services/engine/data_service.py) -------------
    data_max_lag_versions: int = Field(
        256, ge=0, description="a data session this many acknowledged pushes behind refuses the next push "
        "with INGESTION_BEHIND and a retry hint (0: no bound)")
    data_max_lag_s: float = Field(
        10.0, ge=0, description="a data session whose oldest unhandled push is this many seconds old refuses "
        "the next push with INGESTION_BEHIND and a retry hint (0: no bound)")
    redis_url: str | None = Field(
        None, description="Redis of the data sessions' version events (set by `headstart serve` for its "
        "replicas); unset: not published"
    )
    table_cpu_tier_bytes: int | None = Field(None, ge=0, description="CPU tier in front of a remote block store")
    table_device_bytes: int = Field(1 << 30, ge=0, description="device tier budget for table blocks (0: none)")
    table_eviction: Literal["lru", "lfu", "fifo"] = Field("lru", description="device tier eviction policy")
    table_rerank_max_delay: int = Field(
        16, ge=0, description="reranking of table-cache completions (batches and the scheduler): most later "
        "arrivals that may overtake one")
    table_precompute_on_open: bool = Field(
        True, description="precompute a database's missing blocks the first time it is used"
    )


def default(name: str):
    """`EngineSettings`' default for field `name`: the one place an engine default lives (the
    scheduler and the forward worker take theirs from here, so a class built without settings
    behaves as a replica built from them). Raises KeyError for an unknown field."""
    return EngineSettings.model_fields[name].default
