#!/usr/bin/env python3
"""burnlens's Python API against TransformerLens, same random GPT-2 small weights, same run:

- `run_with_cache` with every hook point, batch 1 x 128 and 4 x 256 tokens;
- a patching sweep over all heads: the logit difference with each head's `hook_z` patched
  from a corrupted run into the clean one (144 runs), 1 x 64 tokens — TransformerLens as its
  users write it (`run_with_hooks` per head), burnlens by `model.patching(...)`.

Both sides use the same threads (all cores). Prints a JSON report; run through
`cargo xtask bench-python`, which builds the extension and puts it on PYTHONPATH.

    python scripts/bench_python.py MODEL_DIR [--rounds N]
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

import burnlens


def timed(fn, rounds):
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tl_model(path):
    """An unprocessed HookedTransformer with the checkpoint's weights (TransformerLens's own
    GPT-2 conversion)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_mlp=c.n_inner or 4 * c.n_embd,
        n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
        original_architecture="GPT2LMHeadModel",
    )
    m = HookedTransformer(cfg)
    m.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    return m.eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    bl = burnlens.HookedModel.from_pretrained(args.model)
    tl = tl_model(args.model)
    rng = np.random.default_rng(0)
    vocab = bl.cfg.d_vocab
    report = {"torch_threads": torch.get_num_threads(), "rows": []}

    for batch, seq in [(1, 128), (4, 256)]:
        ids = rng.integers(0, vocab, size=(batch, seq))
        t_ids = torch.tensor(ids)
        # Same numbers first; then every hook point both have (TransformerLens computes
        # per-head results, hook_result, only with use_attn_result, off by default).
        tl_logits, tl_cache = tl.run_with_cache(t_ids)
        common = [k for k in bl.hook_names() if k in tl_cache.cache_dict]
        bl_logits, bl_cache = bl.run_with_cache(ids, names_filter=common)
        d = float(np.abs(bl_logits - tl_logits.numpy()).max())
        dp = float(np.abs(bl_cache["pattern", 5] - tl_cache["pattern", 5].numpy()).max())
        assert d < 1e-3 and dp < 1e-4, f"logits differ by {d}, patterns by {dp}"
        b = timed(lambda: bl.run_with_cache(ids, names_filter=common), args.rounds)
        t = timed(lambda: tl.run_with_cache(t_ids), args.rounds)
        report["rows"].append({"workload": f"run_with_cache, every hook ({len(common)}), {batch}x{seq}", "burnlens_s": b, "transformer_lens_s": t,
                               "speedup": t / b, "max_dlogit": d, "max_dpattern": dp})

    seq = 64
    clean = rng.integers(0, vocab, size=seq)
    corrupted = clean.copy()
    corrupted[seq // 2] = (corrupted[seq // 2] + 1) % vocab
    right, wrong = int(clean[-1]), int((clean[-1] + 7) % vocab)
    L, H = bl.cfg.n_layers, bl.cfg.n_heads

    def tl_sweep():
        c, k = torch.tensor([clean]), torch.tensor([corrupted])
        _, corr_cache = tl.run_with_cache(k, names_filter=lambda n: n.endswith("hook_z"))
        base = tl(c)[0, -1]
        base = (base[right] - base[wrong]).item()
        out = np.zeros((L, H))
        for layer in range(L):
            for head in range(H):
                def hook(z, hook, layer=layer, head=head):
                    z[:, :, head] = corr_cache[hook.name][:, :, head]
                    return z
                logits = tl.run_with_hooks(c, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])[0, -1]
                out[layer, head] = (logits[right] - logits[wrong]).item() - base
        return out

    def bl_sweep():
        return bl.patching(clean, corrupted, f"logit-diff:{right},{wrong}", kinds=["head"])["head"]

    a, b_ = tl_sweep(), bl_sweep()
    d = float(np.abs(a - b_).max())
    assert d < 1e-3, f"patching results differ by {d}"
    rounds = max(1, args.rounds // 2)
    b = timed(bl_sweep, rounds)
    t = timed(tl_sweep, rounds)
    report["rows"].append({"workload": f"activation patching of every head (hook_z, {L * H} runs), 1x{seq}", "burnlens_s": b, "transformer_lens_s": t,
                           "speedup": t / b, "max_abs_diff": d})
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
