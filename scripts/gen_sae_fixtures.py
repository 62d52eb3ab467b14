#!/usr/bin/env python3
"""Build the sparse-autoencoder parity fixtures under tests/fixtures/sae/.

Run through `cargo xtask sae-fixtures` (a local venv with sae-lens, torch and transformers from
PyPI, pinned in xtask). Not run in CI: its output is committed.

Each fixture is an SAE built and saved by `sae-lens` itself (`SAE.save_model`, or a
pre-6.0 cfg.json written by hand and read back by `SAE.load_from_disk`), trained on nothing:
random weights with biases and thresholds shifted so that some features fire and some do not.
Its input is the activation a Hugging Face model fixture produces at the SAE's hook point for
that fixture's token ids, captured with a PyTorch hook on the `transformers` model. Beside
the SAE, `expected.safetensors` holds `ids` [T], `sae_in` [T, d_in] (that activation),
`feature_acts` [T, d_sae] and `sae_out` [T, d_in] as sae-lens computes them, and `meta.json`
names the model fixture.
"""

import json
import os
import shutil
import sys

import torch
import sae_lens
from safetensors.torch import load_file, save_file
from sae_lens import SAE, JumpReLUSAE, JumpReLUSAEConfig, StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


def capture(model_dir, hook):
    """The activation at a TransformerLens hook name on the fixture's ids, from HF modules."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    ids = load_file(os.path.join(model_dir, "expected.safetensors"))["ids"]
    parts = hook.split(".")
    layer = int(parts[1])
    base = model.base_model
    blocks = getattr(base, "h", None) or getattr(base, "layers", None)
    block = blocks[layer]
    got = {}

    def keep(x):
        got.setdefault("x", x)

    if hook.endswith("hook_resid_pre"):
        h = block.register_forward_pre_hook(lambda m, args, kwargs: keep(args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
    elif hook.endswith("attn.hook_z"):
        attn = getattr(block, "attn", None) or getattr(block, "self_attn", None)
        out = getattr(attn, "c_proj", None) or getattr(attn, "o_proj", None) or getattr(attn, "dense", None)
        h = out.register_forward_pre_hook(lambda m, args: keep(args[0]))
    elif hook.endswith("hook_resid_post"):
        h = block.register_forward_hook(lambda m, args, out: keep(out[0] if isinstance(out, tuple) else out))
    elif hook.endswith("hook_mlp_out"):
        h = block.mlp.register_forward_hook(lambda m, args, out: keep(out))
    else:
        raise ValueError(hook)
    with torch.no_grad():
        model(ids.unsqueeze(0))
    h.remove()
    return ids, got["x"][0].detach().float().contiguous()


def shift(sae, x, seed, threshold=False):
    """Biases (and thresholds) that make roughly a third of the features fire on x."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(sae.W_enc.shape, generator=g) / sae.cfg.d_in**0.5)
        sae.W_dec.copy_(torch.randn(sae.W_dec.shape, generator=g) / sae.cfg.d_sae**0.5 * 2.0)
        sae.b_dec.copy_(torch.randn(sae.b_dec.shape, generator=g) * 0.1)
        sae.b_enc.copy_(torch.randn(sae.b_enc.shape, generator=g) * 0.2 - 0.3)
        if threshold:
            sae.threshold.copy_(torch.rand(sae.threshold.shape, generator=g) * 0.6)


def write(name, sae, model_fixture, ids, x, legacy_cfg=None, heads=None):
    out = os.path.join(ROOT, "sae", name)
    shutil.rmtree(out, ignore_errors=True)
    sae.save_model(out)
    if legacy_cfg is not None:
        with open(os.path.join(out, "cfg.json"), "w") as f:
            json.dump(legacy_cfg, f, indent=2)
    # What sae-lens computes after loading the directory back, as a user would.
    loaded = SAE.load_from_disk(out)
    with torch.no_grad():
        # hook_z SAEs take [.., head, d_head] and give it back.
        x_in = x if heads is None else x.view(x.shape[0], heads, -1)
        feats = loaded.encode(x_in)
        recon = loaded.decode(feats).reshape(x.shape)
    save_file({"ids": ids, "sae_in": x, "feature_acts": feats.contiguous(), "sae_out": recon.contiguous()}, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump({"model": model_fixture, "sae_lens": sae_lens.__version__, "torch": torch.__version__, "architecture": loaded.cfg.architecture()}, f, indent=2)
    l0 = (feats > 0).float().sum(-1).mean().item()
    print(f"{name}: {type(loaded).__name__} d_in={loaded.cfg.d_in} d_sae={loaded.cfg.d_sae} mean L0 {l0:.1f}", file=sys.stderr)


def from_burnlens(name, sae_dir, model_fixture):
    """An SAE trained and saved by burnlens, read by sae-lens: what sae-lens computes with it."""
    cfg = json.load(open(os.path.join(sae_dir, "cfg.json")))
    hook = cfg["metadata"]["hook_name"]
    ids, x = capture(os.path.join(ROOT, model_fixture), hook)
    out = os.path.join(ROOT, "sae", name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for f in ("cfg.json", "sae_weights.safetensors"):
        shutil.copy(os.path.join(sae_dir, f), out)
    loaded = SAE.load_from_disk(out)
    with torch.no_grad():
        feats = loaded.encode(x)
        recon = loaded.decode(feats)
    save_file({"ids": ids, "sae_in": x, "feature_acts": feats.contiguous(), "sae_out": recon.contiguous()}, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump({"model": model_fixture, "sae_lens": sae_lens.__version__, "torch": torch.__version__, "architecture": loaded.cfg.architecture(), "trained_by": "burnlens"}, f, indent=2)
    print(f"{name}: burnlens-trained {type(loaded).__name__} read by sae-lens, mean L0 {(feats > 0).float().sum(-1).mean().item():.1f}", file=sys.stderr)


def main():
    torch.manual_seed(0)
    for spec in sys.argv[1:]:
        # NAME=DIR@MODEL_FIXTURE: an SAE burnlens trained (cargo xtask sae-fixtures makes one).
        name, rest = spec.split("=", 1)
        sae_dir, model_fixture = rest.rsplit("@", 1)
        from_burnlens(name, sae_dir, model_fixture)
    fx = lambda n: os.path.join(ROOT, n)
    meta = lambda hook, model: {"hook_name": hook, "model_name": model}

    ids, x = capture(fx("gpt2"), "blocks.1.hook_resid_pre")
    sae = StandardSAE(StandardSAEConfig(d_in=x.shape[-1], d_sae=64, apply_b_dec_to_input=True, metadata=sae_lens.saes.sae.SAEMetadata(**meta("blocks.1.hook_resid_pre", "gpt2"))))
    shift(sae, x, 1)
    write("standard_gpt2_resid", sae, "gpt2", ids, x)

    ids, x = capture(fx("llama_gqa"), "blocks.1.hook_resid_pre")
    sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=x.shape[-1], d_sae=96, metadata=sae_lens.saes.sae.SAEMetadata(**meta("blocks.1.hook_resid_pre", "llama_gqa"))))
    shift(sae, x, 2, threshold=True)
    write("jumprelu_llama_resid", sae, "llama_gqa", ids, x)

    ids, x = capture(fx("pythia_like"), "blocks.2.hook_resid_pre")
    sae = TopKSAE(TopKSAEConfig(d_in=x.shape[-1], d_sae=80, k=6, rescale_acts_by_decoder_norm=True, metadata=sae_lens.saes.sae.SAEMetadata(**meta("blocks.2.hook_resid_pre", "pythia_like"))))
    shift(sae, x, 3)
    write("topk_pythia_resid", sae, "pythia_like", ids, x)

    ids, x = capture(fx("gpt2"), "blocks.0.attn.hook_z")
    sae = StandardSAE(StandardSAEConfig(d_in=x.shape[-1], d_sae=48, apply_b_dec_to_input=False, normalize_activations="layer_norm", reshape_activations="hook_z", metadata=sae_lens.saes.sae.SAEMetadata(**meta("blocks.0.attn.hook_z", "gpt2"))))
    shift(sae, x, 4)
    write("layernorm_gpt2_hook_z", sae, "gpt2", ids, x, heads=4)

    ids, x = capture(fx("qwen2_tied"), "blocks.1.hook_mlp_out")
    sae = StandardSAE(StandardSAEConfig(d_in=x.shape[-1], d_sae=64, normalize_activations="constant_norm_rescale", metadata=sae_lens.saes.sae.SAEMetadata(**meta("blocks.1.hook_mlp_out", "qwen2_tied"))))
    shift(sae, x, 5)
    write("constnorm_qwen2_mlp_out", sae, "qwen2_tied", ids, x)

    # A config as SAELens releases before 6.0 wrote it: the hook at the top level under its
    # old name, TopK as an activation function with kwargs, boolean normalisation.
    ids, x = capture(fx("gpt_neo_local"), "blocks.1.hook_resid_pre")
    sae = TopKSAE(TopKSAEConfig(d_in=x.shape[-1], d_sae=40, k=5, metadata=sae_lens.saes.sae.SAEMetadata(**meta("blocks.1.hook_resid_pre", "gpt_neo_local"))))
    shift(sae, x, 6)
    legacy = {
        "d_in": x.shape[-1],
        "d_sae": 40,
        "hook_point": "blocks.1.hook_resid_pre",
        "hook_point_layer": 1,
        "model_name": "gpt_neo_local",
        "activation_fn_str": "topk",
        "activation_fn_kwargs": {"k": 5},
        "apply_b_dec_to_input": True,
        "normalize_activations": False,
        "dtype": "float32",
        "device": "cpu",
        "sae_lens_training_version": "3.13.0",
    }
    write("legacy_topk_gpt_neo_resid", sae, "gpt_neo_local", ids, x, legacy_cfg=legacy)


if __name__ == "__main__":
    main()
