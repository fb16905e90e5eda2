"""Random-token prompt text, and prompts as text turned into trace rows.

Benchmark clients build synthetic prompts by decoding random token ids with the served
model's tokenizer: inference-perf (`datagen/shared_prefix_datagen.py`,
`SharedPrefixDataGenerator._generate_prompts`: `np.random.randint(0, vocab_size)` ids,
`tokenizer.decode`), SGLang (`bench_serving.py`, `gen_prompt`: `random.choices` over the
vocabulary, `tokenizer.decode`) and vLLM (`benchmarks/datasets`, `PrefixRepetitionRandomDataset`).
The server re-tokenises the text, so the length it computes differs from the nominal one
by a few percent (SGLang and inference-perf do not correct it; vLLM's
`gen_prompt_decode_to_target_len` adjusts the ids until the round trip gives the target).

lmsim has no tokenizer, so `random_token_text(rng, n)` draws n entries of a fixed synthetic
vocabulary shaped like a BPE vocabulary's (70 % " word" pieces, 8 % word fragments without
a leading space, which merge with the letters before them, 12 % punctuation, 10 % digits),
and `lmsim.workload.text_tokens` re-tokenises the text with its measured estimate. The
mix was chosen so that the estimate gives the nominal length on average; measured over 50
prompts each: 128 nominal tokens give 0.991 x nominal (sd 2.5 %), 2,048 give 0.996 x (sd
0.6 %): the few-percent spread of a real round trip, smaller for longer text.

`rows_from_prompts` turns a list of distinct prompt texts into token counts and
content-chained block ids (`TokenStream`), so two prompts share exactly the blocks whose
text they share (a group's system prompt).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from lmsim.workload.text_tokens import TokenStream

VOCAB_SIZE = 8192
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_PUNCT = (".", ",", ";", ":", "?", "!", " (", ")", " -", "'s", ' "', '"')
_MIX = (0.70, 0.08, 0.12, 0.10)  # " word", fragment, punctuation, digit


@cache
def vocabulary() -> tuple[str, ...]:
    """The synthetic vocabulary: fixed (its own seed), whatever the experiment's seed."""
    rng = np.random.default_rng(20261204)
    kinds = rng.choice(4, size=VOCAB_SIZE, p=list(_MIX))
    letters = list(_LETTERS)
    out = []
    for kind in kinds.tolist():
        if kind == 0:
            out.append(" " + "".join(rng.choice(letters, int(rng.integers(2, 8)))))
        elif kind == 1:
            out.append("".join(rng.choice(letters, int(rng.integers(1, 5)))))
        elif kind == 2:
            out.append(_PUNCT[int(rng.integers(0, len(_PUNCT)))])
        else:
            out.append(str(int(rng.integers(0, 10))))
    return tuple(out)


def random_token_text(rng: np.random.Generator, n: int) -> str:
    """The text of n random vocabulary entries (what decoding n random token ids gives)."""
    vocab = vocabulary()
    return "".join(vocab[i] for i in rng.integers(0, VOCAB_SIZE, n).tolist())


def rows_from_prompts(texts: list[str], block_size: int, scale: float = 1.0) -> tuple[np.ndarray, list[np.ndarray]]:
    """(estimated token count, block ids) of each prompt text, its tokens multiplied by
    `scale` (the served tokenizer's round-trip growth). Ids are numbered densely in order of
    first appearance over `texts`, so a shared prefix gets the same ids."""
    ids: dict[bytes, int] = {}
    lengths = np.zeros(len(texts), dtype=np.int64)
    blocks = []
    for k, text in enumerate(texts):
        stream = TokenStream([("user", text)], scale=scale)
        lengths[k] = stream.total
        names = stream.block_names(stream.total, block_size)
        blocks.append(np.array([ids.setdefault(name, len(ids)) for name in names], dtype=np.int64))
    return lengths, blocks


def exact_rows(parts: list[list[tuple[str, int]]], block_size: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(token count, block ids) of prompts given as segments of known length (vLLM's exact
    round trip): a prompt's length is the sum of its segments' nominal lengths, and block d
    is named by the text of every segment up to its end, so prompts that start with the
    same segments share those blocks."""
    ids: dict[tuple[str, ...], int] = {}
    lengths = np.zeros(len(parts), dtype=np.int64)
    blocks = []
    for k, segments in enumerate(parts):
        total = sum(n for _, n in segments)
        lengths[k] = total
        row: list[int] = []
        keys: list[str] = []
        end = 0
        for text, n in segments:
            keys.append(text)
            end += n
            # every block whose last token lies in this segment depends on it and all before
            while len(row) * block_size < total and min((len(row) + 1) * block_size, total) <= end:
                row.append(ids.setdefault((*keys, str(len(row))), len(ids)))
        blocks.append(np.array(row, dtype=np.int64))
    return lengths, blocks
