"""Draft tokens from the prompt: speculative decoding with no draft model.

SQL copies names from the schema and the question: after `FROM`, `singer`;
after `T1.`, a column that the schema spells out token by token. So the
tokens that followed the latest earlier occurrence of the context's last few
tokens (an n-gram, longest first) are a good guess of what comes next
("prompt lookup decoding", vLLM's `ngram` speculator). A decode step then
runs the last token and the guess in one forward (`decode.decode_row`) and
keeps the guessed tokens the model would have picked itself, plus the one
it picks after them: one forward yields one token or several.

Greedy output is unchanged: every kept token is the argmax of the logits at
its own position, and the quantized kernels compute a position's logits the
same whatever else is in the forward (batch invariance), so a token is the
one one-at-a-time decoding picks (tested on the real model).
"""

from __future__ import annotations

NGRAM_MAX = 3
NGRAM_MIN = 1


def draft(context: list[int], max_tokens: int, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN) -> list[int]:
    """Up to `max_tokens` tokens that followed the latest earlier occurrence of
    the context's last n tokens (n from `ngram_max` down to `ngram_min`); []
    when no n-gram recurs. The context is the prompt and the answer so far."""
    if max_tokens <= 0 or len(context) < ngram_min + 1:
        return []
    for n in range(min(ngram_max, len(context) - 1), ngram_min - 1, -1):
        tail = context[-n:]
        # the latest occurrence that ends before the context's end, with something after it
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == tail:
                follow = context[start + n:start + n + max_tokens]
                if follow:
                    return follow
    return []
