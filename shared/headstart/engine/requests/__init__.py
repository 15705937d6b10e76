"""Requests: a submit or a completion, from its prompt to its tokens.

- `generation.GenerationRequest`: the job that catches a cache up to a prompt and decodes.
- `catch_up`: the one rule that moves a cache toward a target prompt (keep, backstep, crop, extend).
- `decode_step`: the one decode step (extend by the last token, pick the next; drafts).
- `sampling`: `SamplingParams` and the `Sampler` that picks a request's tokens.
- `prompt_lookup`: draft tokens copied from the prompt (speculative decoding without a draft model).
"""

from headstart.engine.requests.generation import GenerationRequest, SubmitResult
from headstart.engine.requests.sampling import SamplingParams

__all__ = ["GenerationRequest", "SamplingParams", "SubmitResult"]
