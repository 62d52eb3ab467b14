#!/usr/bin/env python3
"""What TransformerLens computes for burnlens's attribution tools, on the gpt2, pythia_like
(GPT-NeoX: rotary on a quarter of each head, parallel residual) and llama_gqa (RMSNorm, gated
MLP, grouped-query attention, Llama 3 rope scaling) parity fixtures.

Run through `cargo xtask sae-fixtures` (the venv that has sae-lens has transformer-lens, its
dependency). Not run in CI: its output (tests/fixtures/tl/<fixture>.safetensors and .json) is committed.

The fixture's `transformers` model is converted with TransformerLens's own
`convert_gpt2_weights` / `convert_neox_weights` / `convert_llama_weights` into an unprocessed `HookedTransformer` (no weight folding), and on a
clean and a corrupted sequence of 8 tokens it records, for the metric
logit[3] - logit[11] at the last position:
- `grad.<hook>`: the metric's gradient at hook points (TransformerLens backward hooks);
- `cache.<hook>`: every norm's `hook_scale` and `hook_normalized` on the clean run;
- `attr_head` [L, H], `attr_resid` [L, T], `attr_mlp` [L]: attribution patching,
  (corrupted - clean) * clean gradient summed over each node (hook_z per head,
  hook_resid_pre per position, hook_mlp_out);
- `patch_head`, `patch_resid`, `patch_mlp`: activation patching of the same nodes from the
  corrupted run into the clean one, minus the clean metric;
- `dla_heads` [L * H]: `cache.stack_head_results(apply_ln=True)` at the last position along
  ln_final.w * (W_U[:, 3] - W_U[:, 11]); `dla_decompose` the same for `decompose_resid`;
- `cfg` (in the .json): the HookedTransformerConfig's fields that burnlens's `model.cfg` mirrors;
- `lens_logprobs` [L + 1, T, vocab]: `cache.accumulated_resid(apply_ln=True)` unembedded
  (the logit lens, final norm recomputed per layer), log-softmaxed.
"""

import json
import os

import torch
import transformer_lens
from importlib.metadata import version
from safetensors.torch import save_file
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights, convert_llama_weights, convert_neox_weights
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
CLEAN = [5, 17, 33, 2, 90, 12, 7, 64]
CORRUPTED = [5, 17, 33, 2, 91, 12, 7, 64]
RIGHT, WRONG = 3, 11
# TransformerLens's config fields burnlens's Python `model.cfg` mirrors (recorded as `cfg`).
CFG_FIELDS = ["n_layers", "n_heads", "d_model", "d_head", "d_mlp", "d_vocab", "n_ctx", "n_key_value_heads", "eps", "normalization_type",
              "positional_embedding_type", "act_fn", "attn_only", "gated_mlp", "parallel_attn_mlp", "attn_scores_soft_cap", "output_logits_soft_cap",
              "d_vocab_out", "final_rms", "rotary_dim", "rotary_base", "rotary_adjacent_pairs", "use_local_attn", "attn_types", "window_size"]
GRAD_HOOKS = ["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z", "blocks.1.mlp.hook_post", "blocks.2.hook_resid_post"]


def model_from_fixture(name):
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, name), attn_implementation="eager").eval()
    c = hf.config
    if c.model_type == "gpt2":
        cfg = HookedTransformerConfig(
            n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_mlp=c.n_inner or 4 * c.n_embd,
            n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
            original_architecture="GPT2LMHeadModel",
        )
        convert = convert_gpt2_weights
    elif c.model_type == "llama":
        dh = c.hidden_size // c.num_attention_heads
        rope = c.rope_parameters
        cfg = HookedTransformerConfig(
            n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads, n_key_value_heads=c.num_key_value_heads,
            d_head=dh, d_mlp=c.intermediate_size, n_ctx=c.max_position_embeddings, d_vocab=c.vocab_size, act_fn="silu",
            normalization_type="RMS", eps=c.rms_norm_eps, positional_embedding_type="rotary", rotary_dim=dh, rotary_base=rope["rope_theta"],
            rotary_adjacent_pairs=False, gated_mlp=True, final_rms=True, use_NTK_by_parts_rope=True, NTK_by_parts_factor=rope["factor"],
            NTK_by_parts_low_freq_factor=rope["low_freq_factor"], NTK_by_parts_high_freq_factor=rope["high_freq_factor"],
            NTK_original_ctx_len=rope["original_max_position_embeddings"], original_architecture="LlamaForCausalLM",
        )
        convert = convert_llama_weights
    else:
        dh = c.hidden_size // c.num_attention_heads
        rope = c.rope_parameters
        cfg = HookedTransformerConfig(
            n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads, d_head=dh, d_mlp=c.intermediate_size,
            n_ctx=c.max_position_embeddings, d_vocab=c.vocab_size, act_fn=c.hidden_act, normalization_type="LN", eps=c.layer_norm_eps,
            positional_embedding_type="rotary", rotary_dim=int(dh * rope.get("partial_rotary_factor", 1.0)), rotary_base=rope["rope_theta"],
            rotary_adjacent_pairs=False, parallel_attn_mlp=c.use_parallel_residual, original_architecture="GPTNeoXForCausalLM",
        )
        convert = convert_neox_weights
    tl = HookedTransformer(cfg)
    tl.load_state_dict(convert(hf, cfg), strict=False)
    tl.eval()
    with torch.no_grad():
        ids = torch.tensor([CLEAN])
        assert (tl(ids) - hf(ids).logits).abs().max() < 1e-4, "the converted model computes what transformers does"
    return tl


def metric(logits):
    return logits[0, -1, RIGHT] - logits[0, -1, WRONG]


def record(fixture):
    tl = model_from_fixture(fixture)
    L, H, T = tl.cfg.n_layers, tl.cfg.n_heads, len(CLEAN)
    clean, corrupted = torch.tensor([CLEAN]), torch.tensor([CORRUPTED])
    out = {"ids": clean[0], "corrupted_ids": corrupted[0]}

    # Gradients at hook points (backward hooks), on the clean run.
    node_hooks = [f"blocks.{l}.attn.hook_z" for l in range(L)] + [f"blocks.{l}.hook_resid_pre" for l in range(L)] + [f"blocks.{l}.hook_mlp_out" for l in range(L)]
    grads = {}

    def keep(t, hook):
        grads[hook.name] = t.detach().clone()

    tl.reset_hooks()
    for name in set(GRAD_HOOKS + node_hooks):
        tl.add_hook(name, keep, dir="bwd")
    logits, clean_cache = tl.run_with_cache(clean)
    m = metric(logits)
    m.backward()
    tl.reset_hooks()
    out["metric"] = m.detach().reshape(1)
    for name in GRAD_HOOKS:
        out[f"grad.{name}"] = grads[name].contiguous()
    # The norms' hook points as TransformerLens fills them (3.x: the normalized value before
    # the gain, and before the bias for a LayerNorm).
    norm_hooks = [n for n in clean_cache.keys() if ".hook_normalized" in n or ".hook_scale" in n]
    for name in norm_hooks:
        out[f"cache.{name}"] = clean_cache[name].detach().contiguous()

    with torch.no_grad():
        _, corr_cache = tl.run_with_cache(corrupted)
        attr = lambda name: (corr_cache[name] - clean_cache[name]) * grads[name]
        out["attr_head"] = torch.stack([attr(f"blocks.{l}.attn.hook_z").sum(dim=(0, 1, 3)) for l in range(L)])
        out["attr_resid"] = torch.stack([attr(f"blocks.{l}.hook_resid_pre").sum(dim=(0, 2)) for l in range(L)])
        out["attr_mlp"] = torch.stack([attr(f"blocks.{l}.hook_mlp_out").sum() for l in range(L)])

        base = metric(tl(clean)).item()

        def patched(name, select):
            def hook(act, hook):
                src = corr_cache[name]
                act[select] = src[select]
                return act
            return metric(tl.run_with_hooks(clean, fwd_hooks=[(name, hook)])).item() - base

        out["patch_head"] = torch.tensor([[patched(f"blocks.{l}.attn.hook_z", (slice(None), slice(None), h)) for h in range(H)] for l in range(L)])
        out["patch_resid"] = torch.tensor([[patched(f"blocks.{l}.hook_resid_pre", (slice(None), p)) for p in range(T)] for l in range(L)])
        out["patch_mlp"] = torch.tensor([patched(f"blocks.{l}.hook_mlp_out", (slice(None),)) for l in range(L)])

        direction = tl.ln_final.w * (tl.W_U[:, RIGHT] - tl.W_U[:, WRONG])
        heads = clean_cache.stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)  # [L*H, batch, d]
        out["dla_heads"] = (heads[:, 0] @ direction).contiguous()
        comps, labels = clean_cache.decompose_resid(layer=None, apply_ln=True, pos_slice=-1, return_labels=True)
        out["dla_decompose"] = (comps[:, 0] @ direction).contiguous()

        acc = clean_cache.accumulated_resid(layer=None, apply_ln=True)  # [L+1, batch, pos, d]
        lens = acc[:, 0] @ tl.W_U + tl.b_U
        out["lens_logprobs"] = torch.log_softmax(lens, dim=-1).contiguous()

    dest = os.path.join(ROOT, "tl")
    os.makedirs(dest, exist_ok=True)
    save_file({k: v.float().contiguous() if v.dtype.is_floating_point else v for k, v in out.items()}, os.path.join(dest, f"{fixture}.safetensors"))
    with open(os.path.join(dest, f"{fixture}.json"), "w") as f:
        json.dump({"model": fixture, "transformer_lens": version("transformer-lens"), "torch": torch.__version__, "right": RIGHT, "wrong": WRONG,
                   "grad_hooks": GRAD_HOOKS, "norm_hooks": norm_hooks, "decompose_labels": labels,
                   "cfg": {k: getattr(tl.cfg, k) for k in CFG_FIELDS}}, f, indent=2)
    print("wrote", fixture, "decompose labels", labels)


def main():
    for name in ["gpt2", "pythia_like", "llama_gqa"]:
        record(name)


if __name__ == "__main__":
    main()
