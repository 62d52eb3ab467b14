#!/usr/bin/env python3
"""Random bf16 checkpoints with the shapes of Llama 3.1 8B and Gemma 2 9B, for the scale
benchmark (`cargo xtask bench-scale`). Never committed: 16 and 18.5 GB.

Written as `transformers` saves a large model: `config.json` as its config class writes it
(the real models' fields), shards `model-0000i-of-0000n.safetensors` of at most 5 GB in bf16
and `model.safetensors.index.json`. The values are drawn once (a pool of normal values at
each tensor kind's scale) and tiled from random offsets, so that writing 35 GB takes the disk's
time, not the random generator's; transformers loads the result like any checkpoint.

    python scripts/make_scale_checkpoints.py --out target/scale [--only llama31_8b]
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

SHARD_BYTES = 5 * 10**9

LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256,
}

GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 256000,
}


def projections(p, c):
    """One layer's attention and gated-MLP matrices, `[out, in]` as nn.Linear stores them
    (the same names in both families)."""
    d, f = c["hidden_size"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    yield p + "self_attn.q_proj.weight", (q, d), "proj"
    yield p + "self_attn.k_proj.weight", (kv, d), "proj"
    yield p + "self_attn.v_proj.weight", (kv, d), "proj"
    yield p + "self_attn.o_proj.weight", (d, q), "proj"
    yield p + "mlp.gate_proj.weight", (f, d), "proj"
    yield p + "mlp.up_proj.weight", (f, d), "proj"
    yield p + "mlp.down_proj.weight", (d, f), "proj"


def llama_tensors(c):
    d, v = c["hidden_size"], c["vocab_size"]
    yield "model.embed_tokens.weight", (v, d), "embed"
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (d,), "norm"
        yield from projections(p, c)
        yield p + "post_attention_layernorm.weight", (d,), "norm"
    yield "model.norm.weight", (d,), "norm"
    if not c["tie_word_embeddings"]:
        yield "lm_head.weight", (v, d), "proj"


def gemma2_tensors(c):
    d, v = c["hidden_size"], c["vocab_size"]
    yield "model.embed_tokens.weight", (v, d), "embed"
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (d,), "gemma_norm"
        yield p + "post_attention_layernorm.weight", (d,), "gemma_norm"
        yield p + "pre_feedforward_layernorm.weight", (d,), "gemma_norm"
        yield from projections(p, c)
        yield p + "post_feedforward_layernorm.weight", (d,), "gemma_norm"
    yield "model.norm.weight", (d,), "gemma_norm"


MODELS = {"llama31_8b": (LLAMA31_8B, llama_tensors), "gemma2_9b": (GEMMA2_9B, gemma2_tensors)}


def bf16_bits(x):
    """float32 -> bfloat16 bits, rounded to nearest even."""
    b = x.astype(np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


class Pools:
    """A pool of values per tensor kind, tiled from random offsets."""

    def __init__(self, d, seed):
        self.rng = np.random.default_rng(seed)
        n = 1 << 24
        normal = self.rng.standard_normal(n + (1 << 16), dtype=np.float32)
        self.pool = {
            "proj": bf16_bits(normal * (1.0 / np.sqrt(d))),
            "embed": bf16_bits(normal),
            "norm": bf16_bits(1.0 + 0.1 * normal),
            "gemma_norm": bf16_bits(0.1 * normal),
        }
        self.n = n

    def fill(self, kind, count):
        out = np.empty(count, dtype=np.uint16)
        pool = self.pool[kind]
        i = 0
        while i < count:
            take = min(self.n, count - i)
            start = int(self.rng.integers(0, len(pool) - take + 1))
            out[i:i + take] = pool[start:start + take]
            i += take
        return out


def write_shard(path, entries, pools):
    """entries: [(name, shape, kind)] -> one safetensors file, written tensor by tensor."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in entries:
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, kind in entries:
            f.write(pools.fill(kind, int(np.prod(shape))).tobytes())
    return offset


def make(out_root, name):
    config, tensors = MODELS[name]
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    shards, current, size = [], [], 0
    for name_, shape, kind in tensors(config):
        b = int(np.prod(shape)) * 2
        if current and size + b > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name_, shape, kind))
        size += b
    shards.append(current)
    pools = Pools(config["hidden_size"], seed=len(name))
    weight_map, total = {}, 0
    for i, entries in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(d, file), entries, pools)
        weight_map.update({n: file for n, _, _ in entries})
        print(f"{name}: {file} ({len(entries)} tensors)", flush=True)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(f"{name}: {total / 1e9:.2f} GB in {len(shards)} shards at {d}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="target/scale")
    ap.add_argument("--only", default="", help="comma-separated: " + ", ".join(MODELS))
    args = ap.parse_args()
    names = [x for x in args.only.split(",") if x] or list(MODELS)
    for n in names:
        if n not in MODELS:
            sys.exit(f"--only: unknown model {n!r}; expected one of {', '.join(MODELS)}")
        make(args.out, n)


if __name__ == "__main__":
    main()
