#!/usr/bin/env python3
"""The scale benchmark's peer: `transformers` with `dtype=torch.bfloat16` on the same
checkpoint, the same steps as `burnlens bench scale` (load, a forward over `--seq` random
tokens, the same forward keeping every layer's residual stream, then `--new` greedy
decoding steps through the KV cache after it), printed as one JSON line."""

import argparse
import json
import resource
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    t = time.perf_counter()
    m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).eval()
    load_s = time.perf_counter() - t
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, m.config.vocab_size, (1, a.seq), generator=g)
    with torch.no_grad():
        def forward():
            t = time.perf_counter()
            m(ids, use_cache=False).logits.float()
            return time.perf_counter() - t
        first_forward_s = forward()
        forward_s = forward()
        t = time.perf_counter()
        hidden = m(ids, use_cache=False, output_hidden_states=True).hidden_states
        cache_s = time.perf_counter() - t
        del hidden
        out = m(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        t = time.perf_counter()
        for _ in range(a.new):
            out = m(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        decode_s = time.perf_counter() - t
    print(json.dumps({
        "impl": "transformers", "times": [forward_s], "tokens": a.seq, "load_s": load_s, "first_forward_s": first_forward_s, "cache_s": cache_s,
        "decode_s": decode_s, "decode_tokens": a.new, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
