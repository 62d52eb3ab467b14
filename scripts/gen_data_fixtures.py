#!/usr/bin/env python3
"""Build the corpus fixtures under tests/fixtures/data/ with SAELens itself.

Run through `cargo xtask features-fixtures` (the venv with sae-lens pinned in xtask, pyarrow
for the parquet files). Not run in CI: its output is committed.

The corpus is synthetic (seeded random sentences), written three ways: `corpus.txt` (a row
per line), `corpus.jsonl` (a `text` field) and `corpus.parquet` (a `text` column, snappy, in
two row groups), plus a pretokenized `tokens.parquet` (an `input_ids` list<int64> column,
zstd). `windows.json` holds, for several SAELens settings, the windows that SAELens 6's
`concat_and_batch_sequences` cuts from the rows tokenized by the GPT-2 tokenizer
(`../shared/data/gpt2/tokenizer.json`, no special tokens, as the activation store's
`to_tokens(prepend_bos=False)`), with the ids SAELens's activation store passes it.
"""

import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import sae_lens
import torch
from sae_lens.tokenization_and_batching import concat_and_batch_sequences
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "data")
DATA = os.environ.get("BURNLENS_DATA", os.path.join(HERE, "..", "..", "shared", "data"))
BOS = 50256

WORDS = "the a lens burns bright over quiet rivers while seven owls count stars and every wind carries old songs , . ; ! ?".split()


def sentences(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.choice([1, 2, 3, 5, 8, 13, 21, 34])
        rows.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize())
    return rows


def main():
    os.makedirs(OUT, exist_ok=True)
    rows = sentences(120, 7)
    tok = Tokenizer.from_file(os.path.join(DATA, "gpt2", "tokenizer.json"))
    token_rows = [tok.encode(r, add_special_tokens=False).ids for r in rows]

    with open(os.path.join(OUT, "corpus.txt"), "w") as f:
        f.write("\n".join(rows) + "\n")
    with open(os.path.join(OUT, "corpus.jsonl"), "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": i, "text": r}) + "\n")
    pq.write_table(pa.table({"id": list(range(len(rows))), "text": rows}), os.path.join(OUT, "corpus.parquet"), compression="snappy", row_group_size=50)

    cases = [
        {"name": "prepend_bos", "context_size": 24, "prepend_bos": True, "separator": BOS, "disable_concat": False},
        {"name": "no_bos_no_separator", "context_size": 17, "prepend_bos": False, "separator": None, "disable_concat": False},
        {"name": "no_bos_bos_separator", "context_size": 9, "prepend_bos": False, "separator": BOS, "disable_concat": False},
        {"name": "disable_concat", "context_size": 12, "prepend_bos": True, "separator": BOS, "disable_concat": True},
    ]
    for c in cases:
        it = (torch.tensor(t, dtype=torch.long) for t in token_rows)
        windows = concat_and_batch_sequences(
            tokens_iterator=it,
            context_size=c["context_size"],
            begin_batch_token_id=BOS if c["prepend_bos"] else None,
            begin_sequence_token_id=None,
            sequence_separator_token_id=c["separator"],
            disable_concat_sequences=c["disable_concat"],
        )
        c["windows"] = [w.tolist() for w in windows]

    # Pretokenized: the first case's windows as rows one token longer than the context the
    # test asks for (SAELens cuts each to context_size).
    pre = [w + [BOS] for w in cases[0]["windows"]]
    pq.write_table(pa.table({"input_ids": pa.array(pre, type=pa.list_(pa.int64()))}), os.path.join(OUT, "tokens.parquet"), compression="zstd")

    meta = {"sae_lens": sae_lens.__version__, "bos": BOS, "rows": len(rows), "tokenizer": "gpt2/tokenizer.json", "cases": cases}
    with open(os.path.join(OUT, "windows.json"), "w") as f:
        json.dump(meta, f)
    print(f"wrote {OUT}: {[(c['name'], len(c['windows'])) for c in cases]}")


if __name__ == "__main__":
    sys.exit(main())
