"""Two classic exercises from a notebook, with burnlens's Python API:

1. Attention by hand: take W_Q, W_K, W_V, W_O of one layer, rebuild every head's attention
   pattern and the layer's output from the normalized residual stream, and compare with what
   the model computed (`run_with_cache`).
2. Induction heads: train a 2-layer attention-only transformer on repeated random tokens
   (configs/induction-2l.toml), then find the previous-token head and the induction head from
   the attention patterns on a repeated random sequence, and knock the induction head out.

    python examples/python/attention_and_induction.py [MODEL_DIR] [--train-steps N]

(with `burnlens` importable: `pip install ./crates/burnlens-py`, or `maturin develop` there).
"""

import argparse
import os
import sys
import tempfile

import numpy as np

import burnlens

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def attention_by_hand(model_dir, layer=1, tokens=(5, 17, 33, 2, 90, 12, 7, 64, 5, 17, 33)):
    """Rebuild layer `layer` of a GPT-2-style model from its weights. With the weights
    processed (LayerNorm gain and bias folded into W_Q, W_K, W_V, as TransformerLens does), the
    attention input is exactly `ln1.hook_normalized`. Returns the largest differences."""
    model = burnlens.HookedModel.from_pretrained(model_dir, process_weights=True)
    ids = np.array([tokens])
    _, cache = model.run_with_cache(ids)
    x = cache["normalized", layer, "ln1"][0]  # [pos, d_model]
    t = x.shape[0]
    q = np.einsum("pd,hde->hpe", x, model.W_Q[layer]) + model.b_Q[layer][:, None]
    k = np.einsum("pd,hde->hpe", x, model.W_K[layer]) + model.b_K[layer][:, None]
    v = np.einsum("pd,hde->hpe", x, model.W_V[layer]) + model.b_V[layer][:, None]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(model.cfg.d_head)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)  # causal mask
    pattern = softmax(scores)
    z = pattern @ v  # [head, pos, d_head]
    out = np.einsum("hpe,hed->pd", z, model.W_O[layer]) + model.b_O[layer]
    d_pattern = np.abs(pattern - cache["pattern", layer][0]).max()
    d_out = np.abs(out - cache["attn_out", layer][0]).max()
    return float(d_pattern), float(d_out)


def repeated_tokens(vocab, seq_len, batch, seed=0):
    rng = np.random.default_rng(seed)
    half = rng.integers(0, vocab, size=(batch, seq_len))
    return np.concatenate([half, half], axis=1)


def head_scores(model, tokens):
    """Per head, the mean attention to the previous token and, in the repeated half, to the
    token after the earlier copy of the current token (the induction offset)."""
    seq_len = tokens.shape[1] // 2
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    prev, ind = [], []
    for layer in range(model.cfg.n_layers):
        p = cache["pattern", layer]  # [batch, head, q, k]
        prev.append(np.diagonal(p, offset=-1, axis1=2, axis2=3).mean(axis=(0, 2)))
        ind.append(np.diagonal(p, offset=1 - seq_len, axis1=2, axis2=3)[..., 1:].mean(axis=(0, 2)))
    return np.array(prev), np.array(ind)  # [layer, head]


def induction(run_dir=None, steps=None, out_dir=None):
    """Train (unless `run_dir` is given) and find the two heads. Returns a report dict."""
    if run_dir is None:
        out_dir = out_dir or tempfile.mkdtemp(prefix="burnlens-induction-")
        overrides = {"output.dir": os.path.join(out_dir, "run")}
        if steps is not None:
            overrides["training.steps"] = steps
        losses = []
        run_dir = burnlens.train(os.path.join(ROOT, "configs", "induction-2l.toml"), overrides=overrides,
                                 on_step=lambda m: losses.append(m["loss"]))
    model = burnlens.HookedModel.from_pretrained(run_dir)
    tokens = repeated_tokens(model.cfg.d_vocab, 20, 16, seed=1)
    prev, ind = head_scores(model, tokens)
    pl, ph = np.unravel_index(prev.argmax(), prev.shape)
    il, ih = np.unravel_index(ind.argmax(), ind.shape)
    # Knock the induction head out: the loss on the repeated half should rise.
    def loss_second_half(logits):
        s = tokens.shape[1] // 2
        lp = logits - logits.max(-1, keepdims=True)
        lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
        nll = -np.take_along_axis(lp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
        return float(nll[:, s:].mean())

    def ablate(z, hook):
        z = z.copy()
        z[:, :, ih] = 0.0
        return z

    clean = loss_second_half(model(tokens))
    ablated = loss_second_half(model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{il}.attn.hook_z", ablate)]))
    return {"run_dir": run_dir, "previous_token_head": (int(pl), int(ph), float(prev[pl, ph])),
            "induction_head": (int(il), int(ih), float(ind[il, ih])), "loss_repeated_half": clean, "loss_with_head_ablated": ablated}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=os.path.join(ROOT, "tests", "fixtures", "gpt2"))
    ap.add_argument("--train-steps", type=int, default=None)
    args = ap.parse_args()
    dp, do = attention_by_hand(args.model)
    print(f"1. attention by hand: max |pattern diff| {dp:.2e}, max |attn_out diff| {do:.2e}")
    r = induction(steps=args.train_steps)
    print(f"2. trained into {r['run_dir']}")
    print("   previous-token head L{}H{}: score {:.3f}".format(*r["previous_token_head"]))
    print("   induction head      L{}H{}: score {:.3f}".format(*r["induction_head"]))
    print(f"   loss on the repeated half {r['loss_repeated_half']:.3f}, with the induction head ablated {r['loss_with_head_ablated']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
