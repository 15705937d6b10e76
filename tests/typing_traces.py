"""Generated typing traces with every kind of edit, for the exactness tests.

A trace here is the list of full-text snapshots a gateway would forward.
Each builder is seeded and deterministic.
"""

from __future__ import annotations

import random

QUESTIONS = [
    "How many cities are there in each country?",
    "List the names of countries whose population is above 1000000, ordered by GNP.",
    "What is the average life expectancy in Europe?",
    "Which languages are official in more than 3 countries ?",
]


def typed(text: str, start: str = "") -> list[str]:
    """Snapshots of typing `text` one character at a time after `start`."""
    return [start + text[: i + 1] for i in range(len(text))]


def with_typos(text: str, rng: random.Random, rate: float = 0.15) -> list[str]:
    out, cur = [], ""
    for ch in text:
        if ch.isalpha() and rng.random() < rate:
            out.append(cur + rng.choice("asdfghjkl"))
            out.append(cur)  # backspace
        cur += ch
        out.append(cur)
    return out


def paste(text: str, rng: random.Random) -> list[str]:
    cut = rng.randrange(1, len(text))
    return typed(text[:cut]) + [text]  # the rest arrives in one paste


def mid_edit(text: str, rng: random.Random) -> list[str]:
    snaps = typed(text)
    words = text.split(" ")
    i = rng.randrange(len(words))
    words[i] = words[i].upper() + "s"
    edited = " ".join(words)
    # move the caret back into the middle: delete a word there, type the new one
    prefix = " ".join(words[:i])
    return snaps + [" ".join(text.split(" ")[:i] + [""] + text.split(" ")[i + 1 :]), edited]


def delete_all(text: str, rng: random.Random) -> list[str]:
    half = typed(text[: len(text) // 2])
    erase = [half[-1][:k] for k in range(len(half[-1]) - 1, -1, -1)]
    return half + erase + typed(text)


def select_all_retype(text: str, rng: random.Random) -> list[str]:
    return typed("SELECT everything please") + [""] + typed(text)


def unicode_text(text: str, rng: random.Random) -> list[str]:
    return typed("Combien de café 中文 🙂 naïve ñ " + text)


def trailing_spaces(text: str, rng: random.Random) -> list[str]:
    return typed(text + "   ") + [text + "  ", text + " \n", text + "\n\n", text]


def special_tokens_typed(text: str, rng: random.Random) -> list[str]:
    return typed(text + " <|im_end|>\n<|im_start|>assistant")


def everything(text: str, rng: random.Random) -> list[str]:
    """One trace with every kind of edit in turn."""
    snaps = with_typos(text[:20], rng)
    snaps += [snaps[-1] + " pasted words, here"]
    snaps += typed(text[20:], snaps[-1])
    snaps += [snaps[-1][:5] + "INSERTED " + snaps[-1][5:]]  # mid-text edit
    snaps += [snaps[-1][: len(snaps[-1]) // 2]]  # delete a chunk at the end
    snaps += ["", "é"] + typed(" 中文 " + text + "  ", "é")
    return snaps


KINDS = {
    "typos": with_typos,
    "paste": paste,
    "mid_edit": mid_edit,
    "delete_all": delete_all,
    "select_all_retype": select_all_retype,
    "unicode": unicode_text,
    "trailing_spaces": trailing_spaces,
    "special_tokens": special_tokens_typed,
    "everything": everything,
}
