#!/usr/bin/env python3
"""PyTorch peers for burnlens's benchmarks: a lean nanoGPT-style model (fused QKV,
scaled_dot_product_attention, tanh GELU, tied head) written here, plus Hugging Face
`transformers` for the workloads users load checkpoints with.

Subcommands (each prints one JSON line on stdout):
  train   --config shakespeare.json  train nanoGPT's CPU shakespeare-char configuration
                                    exactly as configs/shakespeare-char-cpu.toml describes it
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h, dropout=0.0):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.dropout = dropout

    def attn(self, x, past=None):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        present = (k, v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=past is None and t > 1,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d)), present

    def forward(self, x, past=None):
        a, present = self.attn(self.ln_1(x), past)
        x = x + a
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x, present


class GPT(nn.Module):
    def __init__(self, vocab, ctx, d, layers, heads, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList([Block(d, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, ids, past=None, start=0):
        t = ids.shape[1]
        pos = torch.arange(start, start + t, device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        presents = []
        for i, block in enumerate(self.h):
            x, p = block(x, None if past is None else past[i])
            presents.append(p)
        return self.ln_f(x) @ self.wte.weight.T, presents


def lr_at(c, it):
    if it < c["warmup_steps"]:
        return c["learning_rate"] * (it + 1) / (c["warmup_steps"] + 1)
    if it > c["lr_decay_steps"]:
        return c["min_lr"]
    ratio = (it - c["warmup_steps"]) / (c["lr_decay_steps"] - c["warmup_steps"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c["learning_rate"] - c["min_lr"])


def train(c):
    torch.manual_seed(c["seed"])
    text = open(c["data_path"], encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
    n = int(len(data) * 0.9)
    train_data, val_data = data[:n], data[n:]
    B, T = c["batch_size"], c["block_size"]

    def batch(split):
        d = train_data if split == "train" else val_data
        ix = torch.randint(len(d) - T, (B,))
        x = torch.stack([d[i:i + T] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + T] for i in ix])
        return x, y

    model = GPT(len(chars), T, c["d_model"], c["n_layers"], c["n_heads"])
    decay = [p for p in model.parameters() if p.dim() >= 2 and p is not model.wte.weight and p is not model.wpe.weight]
    no_decay = [p for p in model.parameters() if not any(p is q for q in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["learning_rate"], betas=(c["beta1"], c["beta2"]), eps=1e-8)

    @torch.no_grad()
    def val_loss():
        model.eval()
        g = torch.get_rng_state()
        torch.manual_seed(1234)
        losses = []
        for _ in range(c["eval_batches"]):
            x, y = batch("val")
            logits, _ = model(x)
            losses.append(F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).item())
        torch.set_rng_state(g)
        model.train()
        return sum(losses) / len(losses)

    start = time.perf_counter()
    for it in range(c["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(c, it)
        x, y = batch("train")
        logits, _ = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"])
        opt.step()
    seconds = time.perf_counter() - start
    v = val_loss()
    tokens = c["steps"] * B * T
    return {"peer": "pytorch-lean", "steps": c["steps"], "seconds": seconds, "tokens_per_s": tokens / seconds,
            "val_loss": v, "final_train_loss": loss.item(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--config", required=True, help="JSON with the run's settings")
    args = ap.parse_args()
    if args.cmd == "train":
        with open(args.config) as f:
            c = json.load(f)
        if "threads" in c:
            torch.set_num_threads(c["threads"])
        print(json.dumps(train(c)))


if __name__ == "__main__":
    sys.exit(main())
