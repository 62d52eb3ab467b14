#!/usr/bin/env python3
"""A Gemma Scope SAE fixture in Gemma Scope's own release layout, read by sae-lens's own loader.

Writes tests/fixtures/sae/gemma_scope/gemma-scope-2b-pt-res/layer_1/width_96/average_l0_5/:
`params.npz` as the Gemma Scope releases hold it (W_enc [d_in, d_sae], W_dec [d_sae, d_in],
b_enc, b_dec, threshold; JumpReLU), random weights shifted so that some features fire, on the
llama_gqa fixture's blocks.1.hook_resid_post (d_in 64, d_sae 96). sae-lens reads it with
`gemma_2_sae_huggingface_loader` (the loader of its Gemma Scope releases; the Hub download is
pointed at the local file, d_in / d_sae / model name overridden since the fixture is small),
and `expected.safetensors` holds `ids`, `sae_in` (the activation transformers computes at that
hook), and sae-lens's `feature_acts` and `sae_out`. Run with the venv that has sae-lens
(`cargo xtask sae-fixtures` makes it); not run in CI: the output is committed.
"""

import json
import os

import numpy as np
import sae_lens
import torch
from safetensors.torch import save_file
from sae_lens import SAE, JumpReLUSAE, JumpReLUSAEConfig
from sae_lens.loading import pretrained_sae_loaders as loaders

from gen_sae_fixtures import ROOT, capture, shift

REPO = "google/gemma-scope-2b-pt-res"
FOLDER = "layer_1/width_96/average_l0_5"
HOOK = "blocks.1.hook_resid_post"


def main():
    torch.manual_seed(0)
    ids, x = capture(os.path.join(ROOT, "llama_gqa"), HOOK)
    sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=x.shape[-1], d_sae=96, apply_b_dec_to_input=False))
    shift(sae, x, 7, threshold=True)
    out = os.path.join(ROOT, "sae", "gemma_scope", REPO.split("/")[1], FOLDER)
    os.makedirs(out, exist_ok=True)
    params = os.path.join(out, "params.npz")
    np.savez(params, **{k: getattr(sae, k).detach().numpy().astype(np.float32) for k in ["W_enc", "W_dec", "b_enc", "b_dec", "threshold"]})

    loaders.hf_hub_download = lambda **kw: params  # the "download" is the file above
    cfg, state, _ = loaders.gemma_2_sae_huggingface_loader(REPO, FOLDER, cfg_overrides={"d_in": x.shape[-1], "d_sae": 96, "model_name": "llama_gqa"})
    assert cfg["hook_name"] == HOOK and cfg["apply_b_dec_to_input"] is False, cfg
    # What SAE.from_pretrained does with a loader's output.
    cfg = loaders.handle_config_defaulting(cfg)
    sae_cfg = SAE.get_sae_config_class_for_architecture(cfg["architecture"]).from_dict(cfg)
    loaded = SAE.get_sae_class_for_architecture(sae_cfg.architecture())(sae_cfg)
    loaded.process_state_dict_for_loading(state)
    loaded.load_state_dict(state)
    with torch.no_grad():
        feats = loaded.encode(x)
        recon = loaded.decode(feats)
    save_file({"ids": ids, "sae_in": x, "feature_acts": feats.contiguous(), "sae_out": recon.contiguous()}, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump({"model": "llama_gqa", "hook_name": HOOK, "sae_lens": sae_lens.__version__, "torch": torch.__version__, "loader": "gemma_2_sae_huggingface_loader", "architecture": loaded.cfg.architecture()}, f, indent=2)
    print(f"{out}: {type(loaded).__name__} mean L0 {(feats > 0).float().sum(-1).mean().item():.1f}")


if __name__ == "__main__":
    main()
