#!/usr/bin/env python3
"""Build the Hugging Face parity fixtures under tests/fixtures/.

Run through `cargo xtask fixtures`, which makes a local venv with torch and transformers from
PyPI. Not run in CI: its output is committed.

Each fixture is a small random-weight model built and saved by `transformers` itself, next to
`expected.safetensors` holding what HF computes for a fixed token sequence with eager
attention: `ids` [T] (int64), `logits` [T, vocab], `loss` [1], `pattern.{l}` [heads, T, T],
`resid_pre.{l}` [T, d_model] (the residual stream entering block l), `final` [T, d_model]
(after the final LayerNorm). Weights are scaled up and LayerNorm parameters randomised so
attention patterns are peaked: a wrong scale, mask or transpose changes them visibly.
"""

import argparse
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config,
                          GPT2LMHeadModel, GPTJConfig, GPTJForCausalLM, GPTNeoConfig, GPTNeoForCausalLM,
                          GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Olmo2Config, Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

SEQ_LEN = 20
# Greedy continuation recorded for the rotary families: HF's full forward, argmax, repeated
# (not `generate`, which masks prompt tokens equal to pad_token_id).
GREEDY_PROMPT, GREEDY_NEW = 8, 10


def randomise(model, seed, weight_std=0.25, embed_std=1.0):
    """Peaked attention: large projection weights, random LayerNorm gains and biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("wte.weight", "embed_in.weight", "embed_tokens.weight")) and getattr(model.config, "model_type", "").startswith("gemma"):
                # Gemma multiplies the embedding by sqrt(d_model): keep the residual stream
                # at the other fixtures' scale.
                p.copy_(torch.randn(p.shape, generator=g) * embed_std / model.config.hidden_size ** 0.5)
            elif name.endswith(("wte.weight", "embed_in.weight", "embed_tokens.weight")):
                p.copy_(torch.randn(p.shape, generator=g) * embed_std)
            elif name.endswith("wpe.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 * embed_std)
            elif p.dim() == 1 and ("ln" in name or "norm" in name) and name.endswith("weight"):
                # Gemma's norms multiply by (1 + w): the same gains, shifted.
                shift = 1.0 if getattr(model.config, "model_type", "").startswith("gemma") else 0.0
                p.copy_(0.5 + torch.rand(p.shape, generator=g) * 1.5 - shift)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * weight_std)
    return model


def token_ids(vocab, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.randint(0, vocab, (1, SEQ_LEN), generator=g)


def greedy(model, prompt, n):
    """Greedy continuation by HF's full forward pass, one token at a time."""
    seq = prompt.clone()
    with torch.no_grad():
        for _ in range(n):
            nxt = model(seq).logits[0, -1].argmax().view(1, 1)
            seq = torch.cat([seq, nxt], dim=1)
    return seq[0, prompt.shape[1]:].to(torch.int64)


def record(model, ids, out_dir, dtype=torch.float32, with_greedy=False):
    """Run HF on `ids` and write expected.safetensors with everything the tests compare."""
    model = model.to(dtype).eval()
    with torch.no_grad():
        out = model(ids, labels=ids, output_attentions=True, output_hidden_states=True)
    n_layers = len(out.attentions)
    tensors = {
        "ids": ids[0].clone().to(torch.int64),
        "logits": out.logits[0].float().contiguous(),
        "loss": out.loss.float().reshape(1),
        "final": out.hidden_states[-1][0].float().contiguous(),
    }
    for l in range(n_layers):
        tensors[f"pattern.{l}"] = out.attentions[l][0].float().contiguous()
        tensors[f"resid_pre.{l}"] = out.hidden_states[l][0].float().contiguous()
    if with_greedy:
        tensors["greedy"] = greedy(model, ids[:, :GREEDY_PROMPT], GREEDY_NEW)
    save_file(tensors, os.path.join(out_dir, "expected.safetensors"))
    peak = torch.stack([a[0].max(-1).values.mean() for a in out.attentions]).mean().item()
    return {"mean_max_attention": round(peak, 4), "loss": round(out.loss.item(), 6)}


def fresh(out_root, name):
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def gpt2_config(**kw):
    base = dict(vocab_size=128, n_positions=32, n_embd=32, n_layer=3, n_head=4,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                bos_token_id=0, eos_token_id=0)
    base.update(kw)
    cfg = GPT2Config(**base)
    cfg._attn_implementation = "eager"
    return cfg


def neo_config(**kw):
    base = dict(vocab_size=128, max_position_embeddings=32, hidden_size=32, num_layers=4,
                num_heads=4, attention_types=[[["global", "local"], 2]], window_size=6,
                resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0,
                bos_token_id=0, eos_token_id=0)
    base.update(kw)
    cfg = GPTNeoConfig(**base)
    cfg._attn_implementation = "eager"
    return cfg


def neox_config(**kw):
    base = dict(vocab_size=128, max_position_embeddings=32, hidden_size=64, num_hidden_layers=3,
                num_attention_heads=4, intermediate_size=96, rotary_pct=0.25, rotary_emb_base=10000,
                use_parallel_residual=True, hidden_dropout=0.0, attention_dropout=0.0,
                tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    base.update(kw)
    cfg = GPTNeoXConfig(**base)
    cfg._attn_implementation = "eager"
    return cfg


def llama_family_config(cls, **kw):
    base = dict(vocab_size=128, max_position_embeddings=32, hidden_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                rms_norm_eps=1e-5, attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
                pad_token_id=None)
    base.update(kw)
    cfg = cls(**base)
    cfg._attn_implementation = "eager"
    return cfg


def build(cls, cfg, seed):
    torch.manual_seed(seed)
    # GPT-Neo does not scale its scores, so smaller weights give equally peaked patterns.
    # The rotary families (wider heads, RMSNorm gains) are as peaked at 0.18, where HF's own
    # f32 patterns stay within 5e-6 of f64 (at 0.25 the f32 rounding alone reached 1e-5).
    weight_std = {GPTNeoForCausalLM: 0.15, GPT2LMHeadModel: 0.25}.get(cls, 0.18)
    return randomise(cls(cfg), seed, weight_std=weight_std).eval()


def trained_exports(out_root, exports, manifest):
    """Models trained by burnlens and exported (NAME=DIR): load each with
    AutoModelForCausalLM exactly as a user would, and record what HF computes."""
    from transformers import AutoModelForCausalLM
    for spec in exports:
        name, src = spec.split("=", 1)
        d = fresh(out_root, name)
        for f in os.listdir(src):
            shutil.copy(os.path.join(src, f), d)
        m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
        with open(os.path.join(d, "char_vocab.json")) as f:
            chars = json.load(f)["chars"]
        text = "ROMEO: What say you, my lord?"
        ids = torch.tensor([[chars.index(c) for c in text if c in chars]])
        manifest["fixtures"][name] = record(m, ids, d)
        manifest["fixtures"][name]["loaded_by"] = type(m).__name__


def bpe_export_check(src, manifest):
    """A BPE model exported by burnlens: transformers loads both model and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(src)
    ids = tok("The meaning of life is")["input_ids"]
    assert ids == [464, 3616, 286, 1204, 318], ids
    m = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        logits = m(torch.tensor([ids])).logits
    manifest["bpe_export_check"] = {"tokenizer_ids": ids, "model": type(m).__name__, "logits_shape": list(logits.shape)}


ROTARY_FIXTURES = ["pythia_like", "neox_sequential", "llama_gqa", "qwen2_tied", "mistral_window",
                   "qwen3_qknorm", "olmo2_postnorm", "gptj_interleaved", "gemma2_softcap", "gemma3_local_rope",
                   "phi3_fused"]


def rotary_fixtures(out_root, manifest, only):
    """GPT-NeoX and the Llama family, each saved by save_pretrained."""
    def save(name, cls, cfg, seed):
        if only and name not in only:
            return
        d = fresh(out_root, name)
        m = build(cls, cfg, seed)
        m.save_pretrained(d, safe_serialization=True)
        manifest["fixtures"][name] = record(m, token_ids(128, seed), d, with_greedy=True)

    # Pythia-like: rotary on a quarter of each head (4 of 16 dims), parallel residual, untied embed_out.
    save("pythia_like", GPTNeoXForCausalLM, neox_config(), 11)
    # Sequential GPT-NeoX, half the head rotated, another base, erf GELU replaced by gelu_new.
    save("neox_sequential", GPTNeoXForCausalLM,
         neox_config(use_parallel_residual=False, rotary_pct=0.5, rotary_emb_base=500, hidden_act="gelu_new"), 12)
    # Llama with grouped-query attention (4 query heads, 2 key/value heads), untied lm_head,
    # Llama 3 frequency scaling and a large rope_theta.
    save("llama_gqa", LlamaForCausalLM,
         llama_family_config(LlamaConfig, tie_word_embeddings=False, rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8}), 13)
    # Qwen2: q/k/v biases, tied embeddings.
    save("qwen2_tied", Qwen2ForCausalLM, llama_family_config(Qwen2Config, tie_word_embeddings=True), 14)
    # Mistral: a sliding window (6) shorter than the sequence (20), one key/value head (MQA).
    save("mistral_window", MistralForCausalLM,
         llama_family_config(MistralConfig, num_key_value_heads=1, sliding_window=6, head_dim=16,
                             tie_word_embeddings=False), 15)
    # Qwen3: per-head QK-norm, head_dim (24) independent of hidden_size / heads (16), a
    # sliding window (6) on the last layer, untied.
    save("qwen3_qknorm", Qwen3ForCausalLM,
         llama_family_config(Qwen3Config, head_dim=24, use_sliding_window=True, sliding_window=6,
                             max_window_layers=2, tie_word_embeddings=False), 16)
    # OLMo 2: norms after attention and MLP, QK-norm over the whole projections (GQA: k_norm
    # narrower than q_norm).
    save("olmo2_postnorm", Olmo2ForCausalLM, llama_family_config(Olmo2Config, tie_word_embeddings=False), 17)
    # GPT-J: interleaved rotary on 8 of 16 dims, parallel attention and MLP from one LayerNorm,
    # lm_head with a bias.
    gptj = GPTJConfig(vocab_size=128, n_positions=32, n_embd=64, n_layer=3, n_head=4, rotary_dim=8,
                      n_inner=96, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=0, eos_token_id=0)
    gptj._attn_implementation = "eager"
    save("gptj_interleaved", GPTJForCausalLM, gptj, 18)
    # Gemma 2: (1 + w) norms before and after attention and MLP, sqrt(d) embedding scale,
    # query_pre_attn_scalar (20) unlike head_dim (16), soft-capping low enough to bite (attention
    # 5, logits 8), local (window 6) and global layers alternating, tied, GeGLU.
    save("gemma2_softcap", Gemma2ForCausalLM,
         llama_family_config(Gemma2Config, head_dim=16, query_pre_attn_scalar=20, sliding_window=6,
                             attn_logit_softcapping=5.0, final_logit_softcapping=8.0,
                             num_hidden_layers=4, tie_word_embeddings=True), 19)
    # Gemma 3 text: as Gemma 2 without soft-capping, plus per-head QK-norm, a local rotary base
    # (10000) beside the global one (1e6, linear scaling x4); two local layers then a global.
    save("gemma3_local_rope", Gemma3ForCausalLM,
         llama_family_config(Gemma3TextConfig, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
                             layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                             rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                             tie_word_embeddings=True), 20)
    # Phi-3: fused qkv_proj and gate_up_proj, half of each head rotated, grouped-query
    # attention, a sliding window (6) on every layer, untied.
    save("phi3_fused", Phi3ForCausalLM,
         llama_family_config(Phi3Config, sliding_window=6, tie_word_embeddings=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), 21)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--only", default="", help="comma-separated fixture names to (re)make; the others are kept")
    ap.add_argument("--exports-only", action="store_true", help="record only the --export models; keep the other fixtures")
    ap.add_argument("--export", action="append", default=[], help="NAME=DIR of a burnlens export to record")
    ap.add_argument("--bpe-export", help="DIR of a burnlens BPE export to load with AutoTokenizer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__, "fixtures": {}}
    only = [x for x in args.only.split(",") if x]
    if only or args.exports_only:
        # Remake some fixtures, keep the rest and their manifest entries.
        path = os.path.join(args.out, "manifest.json")
        if os.path.exists(path):
            with open(path) as f:
                manifest = json.load(f)
        unknown = [x for x in only if x not in ROTARY_FIXTURES]
        if unknown:
            sys.exit(f"--only: {unknown} are not among {ROTARY_FIXTURES}")
        if only:
            rotary_fixtures(args.out, manifest, only)
        trained_exports(args.out, args.export, manifest)
        only = only + [e.split("=", 1)[0] for e in args.export]
        with open(path, "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
        print(json.dumps({k: manifest["fixtures"][k] for k in only}, indent=2))
        return
    trained_exports(args.out, args.export, manifest)
    if args.bpe_export:
        bpe_export_check(args.bpe_export, manifest)

    # 1. GPT-2, several layers and heads, model.safetensors as save_pretrained writes it
    #    (`transformer.` prefix, tied lm_head left out).
    d = fresh(args.out, "gpt2")
    m = build(GPT2LMHeadModel, gpt2_config(), 1)
    m.save_pretrained(d, safe_serialization=True)
    manifest["fixtures"]["gpt2"] = record(m, token_ids(128, 1), d)

    # 2. GPT-2 with scale_attn_by_inverse_layer_idx, n_inner != 4*d, erf GELU.
    d = fresh(args.out, "gpt2_inverse_layer")
    m = build(GPT2LMHeadModel, gpt2_config(scale_attn_by_inverse_layer_idx=True, n_inner=80,
                                           activation_function="gelu"), 2)
    m.save_pretrained(d, safe_serialization=True)
    manifest["fixtures"]["gpt2_inverse_layer"] = record(m, token_ids(128, 2), d)

    # 3. GPT-Neo, alternating global/local with a window (6) shorter than the sequence (20),
    #    written by hand with an explicit (tied) lm_head.weight.
    d = fresh(args.out, "gpt_neo_local")
    m = build(GPTNeoForCausalLM, neo_config(), 3)
    m.config.save_pretrained(d)
    sd = {k: v.clone().contiguous() for k, v in m.state_dict().items()}
    assert "lm_head.weight" in sd
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    manifest["fixtures"]["gpt_neo_local"] = record(m, token_ids(128, 3), d)

    # 4. Legacy: an unprefixed GPT2Model state dict in the pre-1.6 pickle format of
    #    pytorch_model.bin, with the old attention buffers.
    d = fresh(args.out, "gpt2_legacy_bin")
    m = build(GPT2LMHeadModel, gpt2_config(n_layer=2, activation_function="relu"), 4)
    m.config.save_pretrained(d)
    sd = {k[len("transformer."):]: v.clone() for k, v in m.state_dict().items()
          if k.startswith("transformer.")}
    n_pos = m.config.n_positions
    for l in range(m.config.n_layer):
        sd[f"h.{l}.attn.bias"] = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.uint8)).view(1, 1, n_pos, n_pos)
        sd[f"h.{l}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(sd, os.path.join(d, "pytorch_model.bin"), _use_new_zipfile_serialization=False)
    manifest["fixtures"]["gpt2_legacy_bin"] = record(m, token_ids(128, 4), d)

    # 5. Half precision: f16 safetensors. HF's reference runs the f16-rounded weights in f32.
    d = fresh(args.out, "gpt2_f16")
    m = build(GPT2LMHeadModel, gpt2_config(n_layer=2, activation_function="gelu_fast"), 5)
    m = m.half()
    m.save_pretrained(d, safe_serialization=True)
    manifest["fixtures"]["gpt2_f16"] = record(m.float(), token_ids(128, 5), d)

    # 6. bf16 GPT-Neo, all-local layers.
    d = fresh(args.out, "gpt_neo_bf16")
    m = build(GPTNeoForCausalLM, neo_config(num_layers=2, attention_types=[[["local"], 2]],
                                            window_size=4, intermediate_size=48), 6)
    m = m.to(torch.bfloat16)
    m.save_pretrained(d, safe_serialization=True)
    manifest["fixtures"]["gpt_neo_bf16"] = record(m.float(), token_ids(128, 6), d)

    # 7. Sharded safetensors with an index, f64 weights.
    d = fresh(args.out, "gpt2_sharded_f64")
    m = build(GPT2LMHeadModel, gpt2_config(n_layer=2), 7).double()
    m.save_pretrained(d, safe_serialization=True, max_shard_size="60KB")
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json")), "expected shards"
    manifest["fixtures"]["gpt2_sharded_f64"] = record(m, token_ids(128, 7), d, dtype=torch.float64)

    rotary_fixtures(args.out, manifest, [])

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    sys.exit(main())
