#!/usr/bin/env python3
"""The SAEDashboard side of `cargo xtask bench-dashboards`, and the SAE both sides read.

`bench_dashboards.py make-sae MODEL_DIR SAE_DIR D_SAE HOOK`: a random standard SAE (sae-lens,
seeded; encoder biases negative so that about 5% of features fire) saved in SAELens's layout.

`bench_dashboards.py run MODEL_DIR SAE_DIR TOKENS FEATURES THREADS`: SAEDashboard 0.8.0's
`SaeVisRunner` with its default layout (top 20, 10 quantile groups of 5, context 5 + 5,
features 256 at a time, token minibatches of 64 windows) on a TransformerLens GPT-2 small
holding the random GPT-2 small's weights (processed as `from_pretrained` processes them),
over random windows of 128 tokens, for the first FEATURES features. Prints one JSON line:
seconds in all and per 256-feature batch (SAEDashboard re-runs the model for every feature
batch, so a run over all features costs about one batch's time per 256 features).
"""

import json
import sys
import time

import torch
from sae_lens import HookedSAETransformer, StandardSAE, StandardSAEConfig
from transformer_lens import HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
from transformers import GPT2LMHeadModel

CONTEXT = 128


def model(model_dir):
    hf = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    c = hf.config
    cfg = HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_mlp=4 * c.n_embd,
                                  n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN",
                                  original_architecture="GPT2LMHeadModel")
    tl = HookedSAETransformer(cfg)
    tl.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=True, center_writing_weights=True, center_unembed=True)
    return tl.eval()


def make_sae(model_dir, sae_dir, d_sae, hook):
    torch.manual_seed(0)
    tl = model(model_dir)
    d_in = tl.cfg.d_model
    sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=d_sae, dtype="float32", device="cpu"))
    sae.cfg.metadata.hook_name = hook
    with torch.no_grad():
        sae.W_enc.normal_(0, 1 / d_in**0.5)
        sae.W_dec.normal_(0, 1 / d_in**0.5)
        # Each feature fires on about 2% of positions: its bias is minus the 98th percentile
        # of its pre-activation on a few random windows.
        _, cache = tl.run_with_cache(torch.randint(1, tl.cfg.d_vocab, (8, CONTEXT)), names_filter=hook)
        pre = (cache[hook].reshape(-1, d_in) - sae.b_dec) @ sae.W_enc
        sae.b_enc.copy_(-pre.quantile(0.98, dim=0))
    sae.save_model(sae_dir)


def run(model_dir, sae_dir, tokens, features, threads):
    from sae_dashboard.sae_vis_data import SaeVisConfig
    from sae_dashboard.sae_vis_runner import SaeVisRunner
    from sae_lens import SAE
    torch.set_num_threads(threads)
    tl = model(model_dir)
    sae = SAE.load_from_disk(sae_dir, device="cpu")
    n = -(-tokens // CONTEXT)
    toks = torch.randint(1, tl.cfg.d_vocab, (n, CONTEXT), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 50256
    cfg = SaeVisConfig(hook_point=sae.cfg.metadata.hook_name, features=list(range(features)), device="cpu", ignore_tokens={50256}, seed=0)
    t0 = time.perf_counter()
    SaeVisRunner(cfg).run(encoder=sae, model=tl, tokens=toks)
    s = time.perf_counter() - t0
    batches = -(-features // cfg.minibatch_size_features)
    print(json.dumps({"seconds": s, "tokens": n * CONTEXT, "features": features, "feature_batches": batches, "seconds_per_batch": s / batches,
                      "threads": threads}))


if __name__ == "__main__":
    if sys.argv[1] == "make-sae":
        make_sae(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
