#!/usr/bin/env python3
"""Write a large pretokenized corpus for memory checks: N random token ids below VOCAB in rows
of CONTEXT tokens, as zstd parquet shards of 1M tokens (an `input_ids` list<int32> column) in
OUT/data/train-*.parquet. Usage: make_token_corpus.py OUT N VOCAB CONTEXT."""

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def main():
    out, n, vocab, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(0)
    per_shard = (1_000_000 // ctx) * ctx
    shards = (n + per_shard - 1) // per_shard
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    for s in range(shards):
        rows = min(per_shard, n - s * per_shard) // ctx
        ids = rng.integers(0, vocab, size=(rows, ctx), dtype=np.int32)
        arr = pa.ListArray.from_arrays(pa.array(np.arange(0, rows * ctx + 1, ctx, dtype=np.int32)), pa.array(ids.reshape(-1)))
        pq.write_table(pa.table({"input_ids": arr}), os.path.join(out, "data", f"train-{s:05d}-of-{shards:05d}.parquet"), compression="zstd")
    print(f"{shards} shards, {shards * per_shard} tokens at most, in {out}")


if __name__ == "__main__":
    main()
