#!/usr/bin/env python3
"""Build the feature-dashboard fixtures under tests/fixtures/dashboards/ with SAEDashboard itself.

Run through `cargo xtask dashboard-fixtures` (a venv of its own, `target/venv-dash`, with
sae-dashboard, sae-lens and torch pinned in xtask). Not run in CI: its output is committed.

The tiny GPT-2 of tests/fixtures/gpt2 goes into TransformerLens (HookedSAETransformer) with
TransformerLens's weight processing (fold_ln, centred writing weights and unembedding), as
`from_pretrained` loads models for SAEDashboard. Per case, a random SAE made by sae-lens
(saved in SAELens's layout under `<case>/sae`) is run by `SaeVisRunner` over fixed random
tokens (`<case>/tokens.json`, each window starting with BOS = 0, which is ignored), with
SAEDashboard's default layout (top group of 20, 10 quantile groups of 5, context 5 + 5).
`<case>/expected.json` holds, per feature, what SAEDashboard computed: the groups' titles
and examples (window, position, token ids, activations), the activation histogram with its
density title, the logit table and the logit histogram.
"""

import json
import os
import sys

import torch
from sae_lens import HookedSAETransformer, JumpReLUSAE, JumpReLUSAEConfig, StandardSAE, StandardSAEConfig
from transformer_lens import HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
from transformers import AutoModelForCausalLM

from sae_dashboard.sae_vis_data import SaeVisConfig
from sae_dashboard.sae_vis_runner import SaeVisRunner

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "dashboards")
N_SEQ, SEQ = 48, 32
BOS = 0


def tiny_gpt2():
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "gpt2"), attn_implementation="eager").eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_mlp=c.n_inner or 4 * c.n_embd,
        n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
        original_architecture="GPT2LMHeadModel",
    )
    tl = HookedSAETransformer(cfg)
    tl.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=True, center_writing_weights=True, center_unembed=True)
    return tl.eval()


def make_sae(kind, hook, d_in, d_sae, seed):
    torch.manual_seed(seed)
    meta = dict(hook_name=hook, model_name="tiny-gpt2")
    if kind == "standard":
        sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=d_sae, dtype="float32", device="cpu", apply_b_dec_to_input=True))
    else:
        sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=d_in, d_sae=d_sae, dtype="float32", device="cpu"))
    for k, v in meta.items():
        setattr(sae.cfg.metadata, k, v)
    with torch.no_grad():
        sae.W_enc.normal_(0, 1 / d_in**0.5)
        sae.W_dec.normal_(0, 1 / d_in**0.5)
        # Decoder rows of unequal norms: SAEDashboard folds them into the encoder first.
        sae.W_dec.mul_(torch.rand(d_sae, 1) + 0.5)
        sae.b_dec.normal_(0, 0.1)
        sae.b_enc.copy_(-0.6 + 0.3 * torch.rand(d_sae))
        if kind == "jumprelu":
            sae.threshold.copy_(0.1 * torch.rand(d_sae))
    return sae


def record(data, features):
    out = []
    for f in features:
        fd = data.feature_data_dict[f]
        groups = []
        for g in fd.sequence_data.seq_group_data:
            ex = [dict(window=s.original_index, position=s.qualifying_token_index, tokens=s.token_ids, acts=s.feat_acts) for s in g.seq_data]
            groups.append(dict(title=g.title, examples=ex))
        a, l, t = fd.acts_histogram_data, fd.logits_histogram_data, fd.logits_table_data
        out.append(dict(
            feature=f, groups=groups,
            acts_histogram=dict(heights=a.bar_heights, values=a.bar_values, title=a.title),
            logits_histogram=dict(heights=l.bar_heights, values=l.bar_values),
            top_logits=t.top_logits, top_token_ids=t.top_token_ids, bottom_logits=t.bottom_logits, bottom_token_ids=t.bottom_token_ids,
        ))
    return out


def case(name, model, kind, hook, d_in, d_sae, seed):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    sae = make_sae(kind, hook, d_in, d_sae, seed)
    sae.save_model(os.path.join(d, "sae"))
    g = torch.Generator().manual_seed(seed + 100)
    tokens = torch.randint(1, model.cfg.d_vocab, (N_SEQ, SEQ), generator=g)
    tokens[:, 0] = BOS
    cfg = SaeVisConfig(hook_point=hook, features=list(range(d_sae)), minibatch_size_features=16, minibatch_size_tokens=16, device="cpu",
                       ignore_tokens={BOS}, seed=0)
    data = SaeVisRunner(cfg).run(encoder=sae, model=model, tokens=tokens)
    with open(os.path.join(d, "tokens.json"), "w") as f:
        json.dump(tokens.tolist(), f)
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(dict(hook=hook, kind=kind, ignore_tokens=[BOS], features=record(data, range(d_sae))), f)
    print(f"{name}: {d_sae} features over {N_SEQ}x{SEQ} tokens")


def main():
    import sae_dashboard
    model = tiny_gpt2()
    d = model.cfg.d_model
    case("standard_resid", model, "standard", "blocks.1.hook_resid_pre", d, 48, 1)
    case("jumprelu_mlp_post", model, "jumprelu", "blocks.1.mlp.hook_post", model.cfg.d_mlp, 40, 2)
    with open(os.path.join(OUT, "versions.json"), "w") as f:
        import importlib.metadata as md
        json.dump({p: md.version(p) for p in ["sae-dashboard", "sae-lens", "transformer-lens", "torch"]}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
