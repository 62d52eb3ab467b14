#!/usr/bin/env python3
"""PyTorch peers for burnlens's benchmarks: a lean nanoGPT-style model (fused QKV,
scaled_dot_product_attention, tanh GELU, tied head) written here, the same model under
`torch.compile` (inductor on the CPU; training with the fused AdamW), plus Hugging Face
`transformers` for the workloads users load checkpoints with.

Subcommands (each prints one JSON line on stdout, timings in seconds):
  train       --config run.json       nanoGPT's CPU shakespeare-char run, as
                                      configs/shakespeare-char-cpu.toml describes it
  train-steps --impl lean|compile|hf  timed training steps of that configuration, random data
  forward     --impl lean|compile|hf --model DIR --batch B --seq T
  generate    --impl lean|hf --model DIR --new N [--prompt P]  greedy, KV cache, P-token prompt (16)
  load        --impl lean|hf --model DIR             wall time and peak RSS
  attention   --impl lean|hf --seq T                 one GPT-2-small attention layer
  gemm        --impl lean|openblas --shape MxKxN[t]    torch.matmul (or numpy's OpenBLAS) on one product (t: the
                                                      [K, N] operand is an [N, K] matrix's .T)
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


def lean_from_hf(model_dir):
    """The lean model with the weights of an HF GPT-2 checkpoint (Conv1D [in, out] -> Linear)."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    m = GPT(cfg["vocab_size"], cfg["n_positions"], cfg["n_embd"], cfg["n_layer"], cfg["n_head"])
    with torch.no_grad():
        m.wte.weight.copy_(sd["wte.weight"]); m.wpe.weight.copy_(sd["wpe.weight"])
        m.ln_f.weight.copy_(sd["ln_f.weight"]); m.ln_f.bias.copy_(sd["ln_f.bias"])
        for i, b in enumerate(m.h):
            p = f"h.{i}."
            for ln in ("ln_1", "ln_2"):
                getattr(b, ln).weight.copy_(sd[p + ln + ".weight"]); getattr(b, ln).bias.copy_(sd[p + ln + ".bias"])
            for ours, theirs in (("c_attn", "attn.c_attn"), ("c_proj", "attn.c_proj"), ("c_fc", "mlp.c_fc"), ("mlp_proj", "mlp.c_proj")):
                getattr(b, ours).weight.copy_(sd[p + theirs + ".weight"].T)
                getattr(b, ours).bias.copy_(sd[p + theirs + ".bias"])
    return m.eval()


DTYPE = torch.float32
# `--device`: where forward, generate and train-steps run (cuda: a GPU through PyTorch's own
# kernels; every timing then waits for the GPU to finish).
DEVICE = torch.device("cpu")


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def load_model(impl, model_dir):
    """The model in DTYPE (`--dtype`: bf16 keeps the weights and computes in bfloat16, as
    `torch_dtype=torch.bfloat16` does)."""
    if impl == "lean":
        return lean_from_hf(model_dir).to(DEVICE, DTYPE)
    if impl == "compile":
        return torch.compile(lean_from_hf(model_dir).to(DEVICE, DTYPE))
    from transformers import GPT2LMHeadModel
    return GPT2LMHeadModel.from_pretrained(model_dir, dtype=DTYPE).to(DEVICE).eval()


def timed(reps, f, warmup=1, warm_s=0.0):
    g = f
    f = lambda: (g(), sync())
    for _ in range(warmup):
        f()
    # At least `warm_s` seconds of repetitions first (burnlens's `bench gemm` does the same:
    # the first 100-200 ms of a process often run at one core's speed on a 2-vCPU VM).
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        f()
    out = []
    for _ in range(reps):
        t = time.perf_counter(); f(); out.append(time.perf_counter() - t)
    return out


def ids(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g)


@torch.no_grad()
def bench_forward(a):
    m = load_model(a.impl, a.model)
    x = ids(a.batch * a.seq, 50257, 1).view(a.batch, a.seq).to(DEVICE)
    f = (lambda: m(x).logits) if a.impl == "hf" else (lambda: m(x))
    # torch.compile traces and compiles on the first calls: time only what follows.
    return {"times": timed(a.reps, f, warmup=3 if a.impl == "compile" else 1), "tokens": a.batch * a.seq}


@torch.no_grad()
def bench_generate(a):
    m = load_model(a.impl, a.model)
    prompt = ids(a.prompt, 50257, 2).view(1, a.prompt).to(DEVICE)
    if a.impl == "hf":
        f = lambda: m.generate(prompt, max_new_tokens=a.new, do_sample=False, min_new_tokens=a.new, pad_token_id=0)
    else:
        def f():
            logits, past = m(prompt)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            for i in range(a.new - 1):
                logits, past = m(nxt, past=past, start=a.prompt + i)
                nxt = logits[:, -1].argmax(-1, keepdim=True)
    return {"times": timed(a.reps, f), "tokens": a.new}


# `burnlens bench train --train-shape NAME`'s shapes: (vocab, context, d, layers, heads,
# batch, steps per repetition). `cargo xtask bench` checks that both sides report the same
# parameter and token counts.
TRAIN_SHAPES = {
    "cpu": (65, 64, 128, 4, 4, 12, 10),
    "shakespeare-char": (65, 256, 384, 6, 6, 8, 3),
    "gpt2": (50257, 256, 768, 12, 12, 1, 2),
}


def bench_train_steps(a):
    torch.manual_seed(0)
    V, T, D, L, H, B, per_rep = TRAIN_SHAPES[a.train_shape]
    if a.impl in ("lean", "compile"):
        m = GPT(V, T, D, L, H)
        run = torch.compile(m) if a.impl == "compile" else m
        fwd = lambda x: run(x)[0]
    else:
        from transformers import GPT2Config, GPT2LMHeadModel
        m = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=T, n_embd=D, n_layer=L, n_head=H,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        fwd = lambda x: m(x).logits
    m.to(DEVICE).train()
    # The compiled peer takes the fastest optimizer PyTorch offers on the CPU as well.
    fused = {"fused": True} if a.impl == "compile" else {}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, **fused)
    # `--dtype bf16`: `torch.autocast` (f32 master weights and optimizer state, bf16 products
    # in the forward and backward, no loss scaling), as burnlens's `--compute bf16`.
    autocast = lambda: torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=DTYPE == torch.bfloat16)
    def step():
        d = torch.randint(0, V, (B, T + 1)).to(DEVICE)
        with autocast():
            logits = fwd(d[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, V), d[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True); loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()
    # Three untimed steps for every peer, as for burnlens (`bench train`): `torch.compile`
    # compiles in them, and every side's allocator settles.
    for _ in range(3):
        step()
    sync()
    times = []
    for _ in range(a.reps * per_rep):
        t = time.perf_counter(); step(); sync(); times.append(time.perf_counter() - t)
    return {"times": times, "tokens": B * T, "params": sum(p.numel() for p in m.parameters())}


def bench_load(a):
    import resource
    size = sum(os.path.getsize(os.path.join(a.model, f)) for f in os.listdir(a.model) if f.endswith(".safetensors"))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = time.perf_counter()
    m = load_model(a.impl, a.model)
    secs = time.perf_counter() - t
    return {"times": [secs], "checkpoint_bytes": size, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss_before_bytes": base}


@torch.no_grad()
def bench_attention(a):
    import resource
    torch.manual_seed(0)
    x = torch.randn(a.batch, a.seq, 768)
    if a.impl == "lean":
        blk = Block(768, 12).eval()
        f = lambda: blk.attn(x)
    else:
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
        cfg = GPT2Config(n_positions=max(1024, a.seq))
        cfg._attn_implementation = "eager"
        att = GPT2Attention(cfg, layer_idx=0).eval()
        f = lambda: att(x)
    times = timed(a.reps, f)
    return {"times": times, "tokens": a.batch * a.seq, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


@torch.no_grad()
def bench_gemm(a):
    dims, transposed = (a.shape[:-1], True) if a.shape.endswith("t") else (a.shape, False)
    m, k, n = (int(d) for d in dims.split("x"))
    if a.impl == "openblas":
        # numpy's matmul on the OpenBLAS its wheel bundles (threads: OPENBLAS_NUM_THREADS,
        # set by the caller before numpy loads).
        import numpy as np
        rng = np.random.default_rng(0)
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32).T if transposed else rng.standard_normal((k, n), dtype=np.float32)
        out = np.empty((m, n), dtype=np.float32)
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        return {"times": timed(a.reps, lambda: np.matmul(x, w, out=out), warm_s=0.3), "flops": 2.0 * m * k * n, "shape": a.shape,
                "blas": f"{blas.get('name')} {blas.get('version')}"}
    # `--dtype bf16`: both operands and the result in bfloat16 (oneDNN's bf16 kernels).
    x = torch.randn(m, k, dtype=DTYPE)
    w = torch.randn(n, k, dtype=DTYPE).T if transposed else torch.randn(k, n, dtype=DTYPE)
    out = torch.empty(m, n, dtype=DTYPE)
    return {"times": timed(a.reps, lambda: torch.matmul(x, w, out=out), warm_s=0.3), "flops": 2.0 * m * k * n, "shape": a.shape}


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--config", required=True, help="JSON with the run's settings")
    for name in ("train-steps", "forward", "generate", "load", "attention", "gemm"):
        p = sub.add_parser(name)
        p.add_argument("--impl", choices=["lean", "compile", "hf", "openblas"], required=True)
        p.add_argument("--model")
        p.add_argument("--batch", type=int, default=1)
        p.add_argument("--seq", type=int, default=128)
        p.add_argument("--reps", type=int, default=3)
        p.add_argument("--new", type=int, default=64)
        p.add_argument("--prompt", type=int, default=16, help="generate: the prompt's tokens")
        p.add_argument("--threads", type=int, default=0)
        p.add_argument("--shape", default="128x768x768")
        p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
        p.add_argument("--train-shape", choices=sorted(TRAIN_SHAPES), default="cpu")
        p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
        p.add_argument("--tf32", action="store_true", help="let CUDA's f32 products run as TF32 (PyTorch's default is off)")
    args = ap.parse_args()
    global DTYPE, DEVICE
    DEVICE = torch.device(getattr(args, "device", "cpu"))
    DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16}[getattr(args, "dtype", "f32")]
    torch.backends.cuda.matmul.allow_tf32 = bool(getattr(args, "tf32", False))
    torch.backends.cudnn.allow_tf32 = bool(getattr(args, "tf32", False))
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    if args.cmd == "train":
        with open(args.config) as f:
            c = json.load(f)
        if "threads" in c:
            torch.set_num_threads(c["threads"])
        print(json.dumps(train(c)))
        return
    run = {"train-steps": bench_train_steps, "forward": bench_forward, "generate": bench_generate,
           "load": bench_load, "attention": bench_attention, "gemm": bench_gemm}[args.cmd]
    out = run(args)
    out.update({"workload": args.cmd.replace("train-steps", "train"), "impl": args.impl, "threads": torch.get_num_threads(),
                "device": str(DEVICE), "torch": torch.__version__})
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
