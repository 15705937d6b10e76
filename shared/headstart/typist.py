"""A seeded synthetic typist: turns a question into a realistic typing trace.

Keystrokes arrive at `wpm` words per minute (5 characters a word) with
jitter; with probability `typo_rate` per character the typist hits a
neighbouring key, notices one keystroke later, backspaces and retypes. Enter
comes one ordinary keystroke interval after the last character, plus `pause_s`.
"""

from __future__ import annotations

import random

from headstart.trace import Trace, TraceEvent

_NEIGHBOURS = "qwertyuiopasdfghjklzxcvbnm"


class Typist:
    def __init__(self, wpm: float = 40.0, typo_rate: float = 0.0, pause_s: float = 0.0, seed: int = 0):
        if wpm <= 0 or not 0 <= typo_rate < 1 or pause_s < 0:
            raise ValueError("need wpm > 0, 0 <= typo_rate < 1, pause >= 0")
        self.interval = 60.0 / (wpm * 5.0)
        self.typo_rate, self.pause_s, self.seed = typo_rate, pause_s, seed

    def trace(self, question: str) -> Trace:
        rng = random.Random(f"{self.seed}:{question}")
        t, text, events = 0.0, "", []

        def key(new_text: str) -> None:
            nonlocal t, text
            t += self.interval * rng.uniform(0.6, 1.4)
            text = new_text
            events.append(TraceEvent(t, text))

        for ch in question:
            if ch.isalpha() and rng.random() < self.typo_rate:
                key(text + rng.choice(_NEIGHBOURS.replace(ch.lower(), "")))
                key(text[:-1])  # backspace
            key(text + ch)
        submit_t = t + self.interval + self.pause_s
        return Trace(tuple(events), submit_t)
