#!/usr/bin/env python3
"""The PyTorch side of the GPU check's SAE training rows (scripts/device_check.sh), for a
machine sae-lens cannot be carried to: a plain loop computing SAELens's training step on
one device — each step one GPT-2 pass over PROMPTS × CONTEXT random tokens (the activation
store's model pass up to the hook `blocks.L.hook_resid_pre`, the HF model's hidden state L), then
SAELens's pass on those activations: `sae_in = x − b_dec`, TopK (ReLU of each row's k
largest pre-activations) or standard (ReLU, L1 weighted by the decoder rows' norms), MSE
summed over the width and averaged over tokens, backward, gradients clipped to norm 1,
Adam. No mixing buffer and no dead-feature terms (a short run has no dead features): this
is the lower bound of what sae-lens does per step. TF32 off (f32 products in f32), as
burnlens's f32 path.

Prints one JSON line: seconds per step over the timed steps (after WARM untimed), the
model pass's share, activations per second. Usage:
peer_sae_step.py MODEL_DIR ARCH STEPS D_SAE K LAYER DEVICE
"""

import json
import sys
import time

import torch
from transformers import GPT2LMHeadModel

CONTEXT, PROMPTS, WARM = 128, 32, 3


def main():
    model_dir, arch, steps, d_sae, k, layer, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = GPT2LMHeadModel.from_pretrained(model_dir).to(device).eval()
    d, vocab = model.config.n_embd, model.config.vocab_size
    # Only the blocks up to the hook's (as sae-lens's store stops at `hook_layer + 1`), and no
    # unembedding: hidden state `layer` is then block `layer`'s input, not yet normed.
    body = model.transformer
    body.h = body.h[: layer + 1]
    w_dec = torch.randn(d_sae, d, device=device)
    w_dec = (w_dec / w_dec.norm(dim=1, keepdim=True) * 0.1).requires_grad_()
    w_enc = w_dec.detach().t().clone().requires_grad_()
    b_enc = torch.zeros(d_sae, device=device, requires_grad=True)
    b_dec = torch.zeros(d, device=device, requires_grad=True)
    params = [w_enc, b_enc, w_dec, b_dec]
    opt = torch.optim.Adam(params, lr=5e-5)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step():
        t0 = time.perf_counter()
        ids = torch.randint(0, vocab, (PROMPTS, CONTEXT), device=device)
        with torch.no_grad():
            x = body(ids, output_hidden_states=True).hidden_states[layer].reshape(-1, d)
        sync()
        t1 = time.perf_counter()
        pre = (x - b_dec) @ w_enc + b_enc
        if arch == "topk":
            vals, idx = pre.topk(k, dim=1)
            acts = torch.zeros_like(pre).scatter(1, idx, torch.relu(vals))
            sparsity = 0.0
        else:
            acts = torch.relu(pre)
            sparsity = (acts * w_dec.norm(dim=1)).norm(p=1, dim=-1).mean()
        out = acts @ w_dec + b_dec
        loss = (out - x).pow(2).sum(-1).mean() + sparsity
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sync()
        return time.perf_counter() - t0, t1 - t0, loss.item()

    for _ in range(WARM):
        step()
    timed = [step() for _ in range(steps)]
    times = [t for t, _, _ in timed]
    passes = [p for _, p, _ in timed]
    per_step = sorted(times)[len(times) // 2]
    print(json.dumps({"impl": "torch", "arch": arch, "device": device, "times": times, "model_pass_s": sorted(passes)[len(passes) // 2],
                      "activations_per_step": PROMPTS * CONTEXT, "activations_per_s": PROMPTS * CONTEXT / per_step, "last_loss": timed[-1][2],
                      "torch": torch.__version__, "d_sae": d_sae, "k": k}))


if __name__ == "__main__":
    main()
