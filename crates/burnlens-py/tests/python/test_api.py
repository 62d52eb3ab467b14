"""The Python API on the committed fixtures, with the Rust suite's tolerances: logits and
patterns against what `transformers` recorded, gradients, caches, patching and DLA against
TransformerLens's record, SAEs against sae-lens's, hooks that edit activations, and bad input
raising the right exception. Run by `cargo test` (crates/burnlens-py/tests/pytest.rs)."""

import json
import os
import struct
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import burnlens

ROOT = os.environ.get("BURNLENS_ROOT", os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def fixture(name):
    return os.path.join(FIXTURES, name)


def read_safetensors(path):
    """The tensors of a safetensors file as numpy arrays (the format is a length, a JSON
    header and the raw little-endian data)."""
    kinds = {"F32": np.float32, "I64": np.int64, "F64": np.float64, "U8": np.uint8}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=kinds[t["dtype"]]).reshape(t["shape"])
    return out


def rel(a, b, floor):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), floor))


PARITY = ["gpt2", "gpt_neo_local", "pythia_like", "llama_gqa", "qwen3_qknorm", "olmo2_postnorm", "gptj_interleaved", "gemma2_softcap", "gemma3_local_rope", "phi3_fused"]


@pytest.mark.parametrize("name", PARITY)
def test_logits_and_patterns_match_transformers(name):
    e = read_safetensors(os.path.join(fixture(name), "expected.safetensors"))
    model = burnlens.HookedModel.from_pretrained(fixture(name))
    ids = e["ids"]
    logits, cache = model.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))
    assert logits.dtype == np.float32 and logits.shape == (1, len(ids), model.cfg.d_vocab)
    assert np.abs(logits[0] - e["logits"]).max() <= 1e-4
    for layer in range(model.cfg.n_layers):
        assert np.abs(cache["pattern", layer][0] - e[f"pattern.{layer}"]).max() <= 1e-5
    # The fused path (no hooks) gives the same logits, and the loss is HF's.
    assert np.abs(model(ids)[0] - e["logits"]).max() <= 1e-4
    assert abs(model(ids, return_type="loss") - float(e["loss"][0])) <= 1e-4
    if "greedy" in e:
        prompt = ids[:8]
        out = model.generate(prompt, max_new_tokens=len(e["greedy"]), prepend_bos=False)
        assert list(out[8:]) == list(e["greedy"])


def tl(name):
    st = read_safetensors(os.path.join(FIXTURES, "tl", f"{name}.safetensors"))
    meta = json.load(open(os.path.join(FIXTURES, "tl", f"{name}.json")))
    return st, meta


@pytest.mark.parametrize("name", ["gpt2", "pythia_like", "llama_gqa"])
def test_gradients_norm_caches_and_patching_match_transformer_lens(name):
    st, meta = tl(name)
    model = burnlens.HookedModel.from_pretrained(fixture(name))
    ids, corrupted = st["ids"], st["corrupted_ids"]
    metric = f"logit-diff:{meta['right']},{meta['wrong']}"
    grads = {k[len("grad."):]: v for k, v in st.items() if k.startswith("grad.")}
    got = model.hook_gradients(ids, list(grads), metric)
    for hook, want in grads.items():
        assert got[hook].shape == want.shape, hook
        assert rel(got[hook], want, 1e-6) < 1e-4, hook
    assert abs(model.metric(ids, metric) - float(st["metric"][0])) < 1e-4
    # Norm hooks as TransformerLens fills them (before the gain).
    norms = {k[len("cache."):]: v for k, v in st.items() if k.startswith("cache.")}
    _, cache = model.run_with_cache(ids, names_filter=list(norms))
    for hook, want in norms.items():
        assert rel(cache[hook], want, 1e-6) < 1e-5, hook
    # Activation and attribution patching, per head, position and MLP.
    for method, prefix in [("activation", "patch"), ("attribution", "attr")]:
        out = model.patching(ids, corrupted, metric, kinds=["head", "resid_pre", "mlp"], method=method)
        for kind, key in [("head", "head"), ("resid_pre", "resid"), ("mlp", "mlp")]:
            assert rel(out[kind], st[f"{prefix}_{key}"], 1e-3) < 1e-4, (method, kind)


@pytest.mark.parametrize("name", ["gpt2", "pythia_like", "llama_gqa"])
def test_config_has_transformer_lens_fields_and_values(name):
    """`model.cfg` equals the HookedTransformerConfig under which TransformerLens reproduces
    the fixture (recorded by scripts/gen_tl_fixtures.py); TransformerLens leaves
    `n_key_value_heads` unset without grouped-query attention."""
    _, meta = tl(name)
    cfg = burnlens.HookedModel.from_pretrained(fixture(name)).cfg
    assert isinstance(cfg, burnlens.Config)
    for field, want in meta["cfg"].items():
        got = getattr(cfg, field)
        if field == "n_key_value_heads" and want is None:
            want = cfg.n_heads
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, (field, got, want)
    assert cfg.n_kv_heads == cfg.n_key_value_heads and cfg.dtype == "f32" and cfg.raw["d_model"] == cfg.d_model
    assert set(meta["cfg"]) <= set(dir(cfg)) and cfg.to_dict()["n_layers"] == cfg.n_layers
    with pytest.raises(AttributeError, match="no field"):
        cfg.n_layer
    with pytest.raises(AttributeError):
        cfg.n_layers = 1


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_dla_and_logit_lens_match_transformer_lens(name):
    st, meta = tl(name)
    model = burnlens.HookedModel.from_pretrained(fixture(name))
    ids = st["ids"]
    dla = model.logit_attribution(ids, meta["right"], meta["wrong"])
    heads = [i for i, l in enumerate(dla["labels"]) if "H" in l and "_" not in l]
    assert rel(dla["contributions"][heads, -1], st["dla_heads"], 1e-3) < 1e-4
    assert dla["max_error"] <= 1e-4
    lens = model.logit_lens(ids, k=3)
    assert len(lens["layers"]) == model.cfg.n_layers + 1
    # The lens's top token at the last layer is the model's own argmax.
    logits = model(ids)[0]
    assert [top[0][0] for top in lens["top"][-1]] == list(logits.argmax(-1))
    with pytest.raises(ValueError, match="token 100000 is outside the vocabulary"):
        model.logit_attribution(ids, 100000)


def test_cached_arrays_are_the_callers_own_writable_and_outlive_the_run():
    # Each array a run hands out is a buffer of its own (entries that are one tensor inside,
    # such as a layer's resid_post and the next one's resid_pre, included), writable, alive
    # after the dict and the model are gone; writing into one changes neither another entry
    # nor the model's next run.
    import gc

    model = burnlens.HookedModel.from_pretrained(fixture("gpt2"))
    ids = np.array([[5, 17, 33, 2, 90, 12, 7, 64]])
    logits, cache = model.run_with_cache(ids)
    want_logits, want = logits.copy(), {k: v.copy() for k, v in cache.items()}
    post0, pre1, pos = cache["blocks.0.hook_resid_post"], cache["blocks.1.hook_resid_pre"], cache["hook_pos_embed"]
    assert np.array_equal(post0, pre1) and not np.shares_memory(post0, pre1)
    assert post0.flags.writeable and post0.flags.c_contiguous and logits.flags.writeable
    post0[...] = 7.0
    pos[...] = -3.0
    logits[...] = 0.0
    assert np.array_equal(cache["blocks.1.hook_resid_pre"], want["blocks.1.hook_resid_pre"])
    again_logits, again = model.run_with_cache(ids)
    assert np.array_equal(again_logits, want_logits)
    assert all(np.array_equal(again[k], want[k]) for k in want)
    kept = cache["blocks.1.attn.hook_pattern"]
    del cache, again, again_logits, model
    gc.collect()
    assert np.array_equal(kept, want["blocks.1.attn.hook_pattern"])


def test_cache_names_short_names_and_residual_views():
    model = burnlens.HookedModel.from_pretrained(fixture("gpt2"))
    ids = np.array([[5, 17, 33, 2, 90, 12, 7, 64]])
    logits, cache = model.run_with_cache(ids)
    assert set(cache.keys()) == set(model.hook_names())
    assert cache["pattern", 1] is cache["blocks.1.attn.hook_pattern"]
    assert cache["resid_pre", 0] is cache["blocks.0.hook_resid_pre"]
    assert cache["post", 2] is cache["blocks.2.mlp.hook_post"]
    assert cache["scale", 0, "ln1"] is cache["blocks.0.ln1.hook_scale"]
    assert cache["embed"] is cache["hook_embed"]
    L = model.cfg.n_layers
    final = cache["resid_post", L - 1]
    # decompose_resid sums to the stream; the last accumulated stream is resid_post.
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels[0] == "embed" and parts.shape[1:] == final.shape
    assert np.abs(parts.sum(0) - final).max() <= 1e-4 * max(1.0, np.abs(final).max())
    acc, acc_labels = cache.accumulated_resid(return_labels=True)
    assert acc_labels[-1] == "final_post" and acc.shape[0] == L + 1
    assert np.array_equal(acc[-1], final)
    mid, mid_labels = cache.accumulated_resid(layer=2, incl_mid=True, return_labels=True)
    assert mid_labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre"]
    assert np.array_equal(mid[1], cache["resid_mid", 0]) and np.array_equal(mid[4], cache["resid_pre", 2])
    assert cache.accumulated_resid(layer=-2).shape[0] == L
    with pytest.raises(ValueError, match="layer 9"):
        cache.accumulated_resid(layer=9)
    # The final norm applied to the last accumulated stream, unembedded, gives the logits.
    normed = cache.accumulated_resid(apply_ln=True)[-1]
    rebuilt = normed @ model.W_U + model.b_U
    assert np.abs(rebuilt - logits).max() <= 1e-3
    # Heads plus b_O are the attention output.
    heads = cache.stack_head_results(layer=1)
    assert heads.shape[0] == model.cfg.n_heads
    assert np.abs(heads.sum(0) + model.b_O[0] - cache["attn_out", 0]).max() <= 1e-4
    # A filter keeps only what it names; a name not cached is a KeyError that says so.
    _, small = model.run_with_cache(ids, names_filter=["blocks.0.attn.hook_pattern"])
    assert list(small.keys()) == ["blocks.0.attn.hook_pattern"]
    with pytest.raises(KeyError, match="not in this cache"):
        small["blocks.0.hook_resid_pre"]
    with pytest.raises(KeyError, match="hook_resid_pre\" is not in this cache"):
        small.accumulated_resid()


def test_weights_have_transformer_lens_shapes_and_rebuild_queries():
    model = burnlens.HookedModel.from_pretrained(fixture("llama_gqa"))
    c = model.cfg
    assert model.W_Q.shape == (c.n_layers, c.n_heads, c.d_model, c.d_head)
    assert model.W_K.shape == (c.n_layers, c.n_heads, c.d_model, c.d_head)
    assert model.W_O.shape == (c.n_layers, c.n_heads, c.d_head, c.d_model)
    assert model.W_E.shape == (c.d_vocab, c.d_model) and model.W_U.shape == (c.d_model, c.d_vocab)
    assert model.W_gate.shape == model.W_in.shape == (c.n_layers, c.d_model, c.d_mlp)
    # With the norm gains folded in (processing), ln1's normalized input times W_Q plus b_Q is
    # the cached query of every head.
    p = burnlens.HookedModel.from_pretrained(fixture("llama_gqa"), process_weights=True)
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    _, cache = p.run_with_cache(ids, names_filter=["blocks.1.ln1.hook_normalized", "blocks.1.attn.hook_q"])
    x = cache["blocks.1.ln1.hook_normalized"][0]  # [pos, d_model]
    q = cache["blocks.1.attn.hook_q"][0]  # [pos, head, d_head]
    for h in range(c.n_heads):
        rebuilt = x @ p.W_Q[1, h] + p.b_Q[1, h]
        assert np.abs(rebuilt - q[:, h]).max() <= 1e-4 * max(1.0, np.abs(q).max())


def test_hooks_edit_activations_exactly_where_they_should():
    model = burnlens.HookedModel.from_pretrained(fixture("gpt2"))
    ids = np.array([[5, 17, 33, 2, 90, 12, 7, 64]])
    layer, head = 1, 2
    _, clean = model.run_with_cache(ids)
    seen = []

    def zero_head(z, hook):
        seen.append(hook.name)
        z = z.copy()
        z[:, :, head] = 0.0
        return z

    logits, ablated = None, None
    with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)]):
        logits, ablated = model.run_with_cache(ids)
    assert seen == [f"blocks.{layer}.attn.hook_z"] and model._hooks == []
    # Zero-ablating one head removes exactly its write z_h W_O[h] from the attention output.
    z = clean["z", layer][0, :, head]  # [pos, d_head]
    removed = z @ model.W_O[layer, head]
    diff = clean["attn_out", layer][0] - ablated["attn_out", layer][0]
    assert np.abs(diff - removed).max() <= 1e-4 * max(1.0, np.abs(removed).max())
    # Everything before that layer is untouched, and the logits move.
    assert np.array_equal(clean["resid_pre", layer], ablated["resid_pre", layer])
    assert np.abs(logits - model(ids)).max() > 1e-3
    # A hook that returns None observes only; run_with_hooks with a predicate reaches every match.
    names = []
    out = model.run_with_hooks(ids, fwd_hooks=[(lambda n: n.endswith("hook_resid_pre"), lambda a, h: names.append(h.name))])
    assert names == [f"blocks.{l}.hook_resid_pre" for l in range(model.cfg.n_layers)]
    assert np.array_equal(out, model(ids))
    # Steering: adding a vector to the residual stream changes the logits by its effect only.
    v = np.zeros(model.cfg.d_model, np.float32)
    v[0] = 10.0
    steered = model.run_with_hooks(ids, fwd_hooks=[("blocks.2.hook_resid_pre", lambda a, h: a + v)])
    assert np.abs(steered - model(ids)).max() > 1e-3


def test_padded_batches_match_single_sequences():
    model = burnlens.HookedModel.from_pretrained(fixture("llama_gqa"))
    a = [5, 17, 33, 2, 90, 12]
    b = [7, 64, 3]
    tokens = np.array([a, b + [0, 0, 0]])
    mask = np.array([[True] * 6, [True] * 3 + [False] * 3])
    logits = model(tokens, attention_mask=mask)
    assert np.abs(logits[0] - model(np.array([a]))[0]).max() <= 1e-4
    assert np.abs(logits[1, :3] - model(np.array([b]))[0]).max() <= 1e-4


def test_saes_match_sae_lens_and_splice_into_the_model():
    for name in ["standard_gpt2_resid", "jumprelu_llama_resid", "topk_pythia_resid"]:
        d = os.path.join(FIXTURES, "sae", name)
        e = read_safetensors(os.path.join(d, "expected.safetensors"))
        sae = burnlens.SAE.load(d)
        f = sae.encode(e["sae_in"])
        assert rel(f, e["feature_acts"], 1.0) <= 1e-5, name
        assert np.array_equal(f > 0, e["feature_acts"] > 0), name
        assert rel(sae.decode(f), e["sae_out"], 1.0) <= 1e-5, name
        # Leading dimensions are kept.
        assert sae.encode(e["sae_in"][None]).shape == (1,) + e["feature_acts"].shape
    meta = json.load(open(os.path.join(FIXTURES, "sae", "standard_gpt2_resid", "meta.json")))
    model = burnlens.HookedModel.from_pretrained(fixture(meta["model"]))
    sae = burnlens.SAE.load(os.path.join(FIXTURES, "sae", "standard_gpt2_resid"))
    ids = read_safetensors(os.path.join(FIXTURES, "sae", "standard_gpt2_resid", "expected.safetensors"))["ids"]
    spliced = model.run_with_saes(ids, saes=[sae])
    # The same as replacing the activation by the SAE's reconstruction by hand.
    by_hand = model.run_with_hooks(ids, fwd_hooks=[(sae.hook_name, lambda a, h: sae.decode(sae.encode(a)).astype(np.float32))])
    assert np.abs(spliced - by_hand).max() <= 1e-4
    assert np.abs(spliced - model(ids)).max() > 1e-4


def test_gemma_scope_release_layout():
    d = os.path.join(FIXTURES, "sae", "gemma_scope", "gemma-scope-2b-pt-res", "layer_1", "width_96", "average_l0_5")
    e = read_safetensors(os.path.join(d, "expected.safetensors"))
    sae = burnlens.SAE.load(d)
    assert sae.hook_name == "blocks.1.hook_resid_post"
    assert rel(sae.encode(e["sae_in"]), e["feature_acts"], 1.0) <= 1e-5


def test_padded_loss_is_the_mean_over_real_next_token_pairs_and_kinds_take_aliases():
    model = burnlens.HookedModel.from_pretrained(fixture("gpt2"))
    a, b = [5, 9, 2, 7, 3, 8], [4, 1, 6]
    la, lb = model(np.array([a]), return_type="loss"), model(np.array([b]), return_type="loss")
    padded = np.array([a, b + [0, 0, 0]])
    mask = np.array([[True] * 6, [True] * 3 + [False] * 3])
    both = model(padded, return_type="loss", attention_mask=mask)
    assert abs(both - (5 * la + 2 * lb) / 7) <= 1e-5, (both, la, lb)
    logits, loss = model(np.array([a]), return_type="both")
    assert logits.shape[1] == 6 and loss == la
    with pytest.raises(ValueError, match="at least two tokens"):
        model(np.array([[5]]), return_type="loss")
    out = model.patching(a, [5, 9, 2, 7, 3, 1], "logprob:9", kinds=["heads", "mlps"])
    assert set(out) == {"clean_metric", "head", "mlp"}
    assert out["head"].shape == (model.cfg.n_layers, model.cfg.n_heads)
    with pytest.raises(ValueError, match='unknown node kind "neurons"; expected head, resid_pre or mlp'):
        model.patching(a, a, "logprob:9", kinds=["neurons"])
    # The final norm recomputed by the library, then the unembedding, gives the logits.
    logits, cache = model.run_with_cache(np.array([a]))
    resid = cache["resid_post", model.cfg.n_layers - 1]
    np.testing.assert_allclose(model.apply_ln_final(resid) @ model.W_U + model.b_U, logits, atol=1e-4)


def test_short_hook_names_are_transformer_lens_get_act_name_and_index_the_cache():
    assert burnlens.get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern"
    assert burnlens.get_act_name("resid_pre", 3) == "blocks.3.hook_resid_pre"
    assert burnlens.get_act_name("post", 1) == "blocks.1.mlp.hook_post"
    assert burnlens.get_act_name("scale", 2, "ln1") == "blocks.2.ln1.hook_scale"
    assert burnlens.get_act_name("normalized") == "ln_final.hook_normalized"
    assert burnlens.get_act_name("embed") == "hook_embed"
    assert burnlens.get_act_name("blocks.0.hook_resid_post") == "blocks.0.hook_resid_post"
    with pytest.raises(KeyError, match="needs the norm"):
        burnlens.get_act_name("scale", 2)
    with pytest.raises(KeyError, match="needs a layer"):
        burnlens.get_act_name("pattern")
    with pytest.raises(KeyError, match="not a TransformerLens short hook name"):
        burnlens.get_act_name("nonsense", 0)
    model = burnlens.HookedModel.from_pretrained(fixture("gpt2"))
    _, cache = model.run_with_cache(np.array([[1, 2, 3]]))
    np.testing.assert_array_equal(cache["pattern", 1], cache["blocks.1.attn.hook_pattern"])
    np.testing.assert_array_equal(cache["scale", 0, "ln2"], cache["blocks.0.ln2.hook_scale"])


def test_bad_input_raises_the_right_exception_with_the_cli_message():
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        burnlens.HookedModel.from_pretrained(os.path.join(FIXTURES, "no-such-model"))
    model = burnlens.HookedModel.from_pretrained(fixture("gpt2"))
    with pytest.raises(KeyError, match="is not a hook point of this model"):
        model.run_with_cache(np.array([[1, 2]]), names_filter=["blocks.0.attn.hook_nothing"])
    with pytest.raises(KeyError, match="not a hook point"):
        model.run_with_hooks(np.array([[1, 2]]), fwd_hooks=[("blocks.9.hook_resid_pre", lambda a, h: a)])
    with pytest.raises(ValueError, match="token id 100000 at position 1 is out of range"):
        model(np.array([[1, 100000]]))
    with pytest.raises(ValueError, match="expected integer token ids"):
        model(np.array([[1.5, 2.0]]))
    with pytest.raises(ValueError, match="must keep the activation's shape"):
        model.run_with_hooks(np.array([[1, 2]]), fwd_hooks=[("hook_embed", lambda a, h: a[:, :1])])
    with pytest.raises(ZeroDivisionError):
        model.run_with_hooks(np.array([[1, 2]]), fwd_hooks=[("hook_embed", lambda a, h: 1 / 0)])
    with pytest.raises(ValueError, match="metric"):
        model.hook_gradients(np.array([[1, 2, 3]]), ["hook_embed"], "logit-diff:1")
    with pytest.raises(ValueError, match="attention-only|sae|SAE|width|d_in|expected"):
        burnlens.SAE.load(os.path.join(FIXTURES, "sae", "standard_gpt2_resid")).encode(np.zeros((2, 7), np.float32))


def test_processing_weights_keeps_log_probabilities():
    ids = np.array([[5, 17, 33, 2, 90, 12, 7, 64]])
    for name in ["gpt2", "olmo2_postnorm"]:
        raw = burnlens.HookedModel.from_pretrained(fixture(name))
        processed = burnlens.HookedModel.from_pretrained(fixture(name), process_weights=True)
        lp = lambda x: x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)
        assert np.abs(lp(raw(ids)) - lp(processed(ids))).max() <= 1e-4
        assert bool(processed.processing_dropped) == (name == "olmo2_postnorm")


def test_train_from_python_with_a_step_callback(tmp_path):
    data = os.environ.get("BURNLENS_DATA", os.path.join(ROOT, "..", "shared", "data"))
    text = os.path.join(data, "tinyshakespeare.txt")
    if not os.path.exists(text):
        if os.environ.get("CI"):
            pytest.fail(f"{text} is missing")
        pytest.skip(f"{text} is missing")
    steps = []
    run = burnlens.train(os.path.join(ROOT, "configs", "tiny-char.toml"),
                         overrides={"data.path": text, "output.dir": str(tmp_path / "run"), "training.steps": 4, "model.family": "qwen3"},
                         on_step=steps.append)
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and all(np.isfinite(s["loss"]) for s in steps)
    model = burnlens.HookedModel.from_pretrained(run)
    assert model.to_string(model.to_tokens("ROMEO", prepend_bos=False)[0]) == "ROMEO"
    # An exception in the callback stops the run and comes back.
    def stop(_):
        raise RuntimeError("enough")
    with pytest.raises(RuntimeError, match="enough"):
        burnlens.train(os.path.join(ROOT, "configs", "tiny-char.toml"),
                       overrides={"data.path": text, "output.dir": str(tmp_path / "run2"), "training.steps": 50}, on_step=stop)
    # ... after checkpointing the step it raised at, so the run resumes from there.
    assert (tmp_path / "run2" / "checkpoints" / "LATEST").read_text().strip() == "step-000001"
    with pytest.raises(FileNotFoundError):
        burnlens.train(str(tmp_path / "missing.toml"))
    # Overrides are Python values, written as TOML by the library; one it cannot write is named.
    with pytest.raises(ValueError, match="training.steps"):
        burnlens.train(os.path.join(ROOT, "configs", "tiny-char.toml"), overrides={"training.steps": None})


def test_a_hook_point_knows_its_layer_from_the_librarys_parse():
    assert burnlens.HookPoint("blocks.3.attn.hook_z").layer() == 3
    assert burnlens.HookPoint("blocks.11.hook_resid_post").layer() == 11
    assert burnlens.HookPoint("hook_embed").layer() is None and burnlens.HookPoint("ln_final.hook_normalized").layer() is None
    with pytest.raises(KeyError, match="not a hook point"):
        burnlens.HookPoint("blocks.x.nothing").layer()


class _Hub(SimpleHTTPRequestHandler):
    """A Hugging Face Hub stand-in for one repository: the revision API and resolve URLs."""

    repo_dir = None
    commit = "0123456789abcdef0123456789abcdef01234567"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head=False):
        path = self.path.split("?")[0]
        files = sorted(os.listdir(self.repo_dir))
        if path.startswith("/api/models/org/tiny/revision/"):
            body = json.dumps({"id": "org/tiny", "sha": self.commit, "siblings": [{"rfilename": f} for f in files]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        prefix = "/org/tiny/resolve/"
        if path.startswith(prefix):
            name = path[len(prefix):].split("/", 1)[1]
            full = os.path.join(self.repo_dir, name)
            if os.path.isfile(full):
                body = open(full, "rb").read()
                import hashlib
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Repo-Commit", self.commit)
                self.send_header("ETag", '"' + hashlib.sha256(body).hexdigest() + '"')
                self.send_header("X-Linked-Etag", '"' + hashlib.sha256(body).hexdigest() + '"')
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_hub_id_loads_from_a_stand_in_server(tmp_path, monkeypatch):
    handler = type("Hub", (_Hub,), {"repo_dir": fixture("qwen3_qknorm")})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        by_id = burnlens.HookedModel.from_pretrained("org/tiny")
        local = burnlens.HookedModel.from_pretrained(fixture("qwen3_qknorm"))
        ids = np.array([[1, 2, 3, 4, 5]])
        assert np.array_equal(by_id(ids), local(ids))
        assert by_id.cfg.family == "qwen3"
    finally:
        server.shutdown()


def _example():
    import importlib.util
    path = os.path.join(ROOT, "examples", "python", "attention_and_induction.py")
    spec = importlib.util.spec_from_file_location("attention_and_induction", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_rebuilds_attention_by_hand():
    ex = _example()
    for name in ["gpt2", "gpt2_sharded_f64"]:
        dp, do = ex.attention_by_hand(fixture(name))
        assert dp <= 1e-5 and do <= 1e-4, (dp, do)


def test_example_finds_induction_heads(tmp_path):
    r = _example().induction(out_dir=str(tmp_path))
    pl, ph, ps = r["previous_token_head"]
    il, ih, score = r["induction_head"]
    assert (pl, il) == (0, 1), r
    assert ps > 0.4 and score > 0.4, r
    assert r["loss_with_head_ablated"] > 1.5 * r["loss_repeated_half"], r


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "gemma2_softcap"])
def test_half_weights_work_everywhere_and_equal_their_f32_widening(name):
    """A bf16 checkpoint (tests/fixtures/bf16) keeps bf16 weights by default; every verb
    returns float32 and agrees with the same checkpoint loaded as f32."""
    path = os.path.join(FIXTURES, "bf16", name)
    e = read_safetensors(os.path.join(path, "expected.safetensors"))
    ids = e["ids"]
    half = burnlens.HookedModel.from_pretrained(path)
    wide = burnlens.HookedModel.from_pretrained(path, dtype="float32")
    assert half.cfg.dtype == "bf16" and wide.cfg.dtype == "f32"
    # torch's spelling is accepted by name.
    assert burnlens.HookedModel.from_pretrained(path, dtype="torch.bfloat16").cfg.dtype == "bf16"
    lh, ch = half.run_with_cache(ids)
    lw, cw = wide.run_with_cache(ids)
    assert lh.dtype == np.float32 and np.abs(lh[0] - e["logits"]).max() <= 1e-4
    assert sorted(ch.keys()) == sorted(cw.keys())
    for k in cw.keys():
        assert rel(ch[k], cw[k], 1.0) <= 1e-5, k
    wh, ww = half.weights, wide.weights
    for k in ww:
        assert wh[k].dtype == np.float32 and np.array_equal(wh[k], ww[k]), k
    hooks = [f"blocks.{l}.hook_resid_pre" for l in range(half.cfg.n_layers)]
    gh, gw = half.hook_gradients(ids, hooks, "loss"), wide.hook_gradients(ids, hooks, "loss")
    for k in hooks:
        assert rel(gh[k], gw[k], 1e-6) <= 1e-4, k
    corrupted = ids[::-1].copy()
    ph = half.patching(ids, corrupted, "loss", kinds=["head", "mlp"])
    pw = wide.patching(ids, corrupted, "loss", kinds=["head", "mlp"])
    for kind in ["head", "mlp"]:
        assert rel(ph[kind], pw[kind], 1e-3) <= 1e-4, kind
    dh, dw = half.logit_attribution(ids, 1, 2), wide.logit_attribution(ids, 1, 2)
    assert rel(dh["contributions"], dw["contributions"], 1e-3) <= 1e-4 and dh["max_error"] <= 1e-4
    with pytest.raises(ValueError, match="expected one of auto, f32, bf16, f16"):
        burnlens.HookedModel.from_pretrained(path, dtype="fp8")


def test_bf16_compute_runs_every_verb_in_bf16_products_and_stays_close_to_f32():
    """compute_dtype="bf16": logits, caches and hook gradients move a little from f32 (the
    products round their operands) and stay float32; the setting is process-wide, reported,
    and a wrong name is refused with the choices."""
    # Where the CPU has no bf16 instructions, the emulated products (read at the first one).
    os.environ["BURNLENS_BF16"] = "emulate"
    path = os.path.join(FIXTURES, "bf16", "llama_gqa")
    ids = read_safetensors(os.path.join(path, "expected.safetensors"))["ids"]
    model = burnlens.HookedModel.from_pretrained(path)
    hooks = [f"blocks.{l}.hook_resid_pre" for l in range(model.cfg.n_layers)]
    try:
        assert burnlens.compute_dtype() == "f32"
        l32, c32 = model.run_with_cache(ids)
        g32 = model.hook_gradients(ids, hooks, "loss")
        bf = burnlens.HookedModel.from_pretrained(path, compute_dtype="torch.bfloat16")
        assert burnlens.compute_dtype() == "bf16"
        l16, c16 = bf.run_with_cache(ids)
        g16 = bf.hook_gradients(ids, hooks, "loss")
        assert l16.dtype == np.float32 and 0 < np.abs(l16 - l32).max() <= 0.05 * np.abs(l32).max()
        assert np.array_equal(l16.argmax(-1), l32.argmax(-1))
        worst = max((rel(c16[k], c32[k], 1.0), k) for k in c32.keys())
        assert worst[0] <= 0.1, worst  # a random model's peaked patterns move most
        for k in hooks:
            assert 0 < rel(g16[k], g32[k], 1e-6) <= 5e-2, k
        with pytest.raises(ValueError, match="expected one of f32, bf16, tf32"):
            burnlens.set_compute_dtype("fp8")
        # tf32 hands a GPU's products to its tensor cores; on the CPU it is f32, bit for bit.
        burnlens.set_compute_dtype("tf32")
        assert burnlens.compute_dtype() == "tf32"
        assert np.array_equal(model.run_with_cache(ids)[0], l32)
    finally:
        burnlens.set_compute_dtype("f32")
    assert burnlens.compute_dtype() == "f32"
    assert np.array_equal(model.run_with_cache(ids)[0], l32)


@pytest.mark.parametrize("name", ["gpt2", "gpt2_clt", "llama_skip", "gemma2", "gpt2_trained", "gpt2_clt_trained"])
def test_attribution_graphs_equal_circuit_tracers(name, tmp_path):
    """burnlens.attribute on circuit-tracer's fixtures (tests/fixtures/trace): the same
    graph as circuit-tracer's `attribute`, the same pruning and scores, and the saved files."""
    case_dir = os.path.join(FIXTURES, "trace", name)
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    e = read_safetensors(os.path.join(case_dir, "expected.safetensors"))
    model = burnlens.HookedModel.from_pretrained(os.path.join(case_dir, "model"))
    tc = burnlens.Transcoders.load(os.path.join(case_dir, "transcoders"))
    assert tc.n_layers == model.cfg.n_layers
    g = burnlens.attribute(model, tc, np.array(case["ids"]), max_n_logits=case["max_n_logits"], desired_logit_prob=case["desired_logit_prob"],
                           batch_size=case["batch_size"], max_feature_nodes=case["max_feature_nodes"])
    assert np.array_equal(g.active_features, e["active_features"])
    assert np.array_equal(g.selected_features, e["selected_features"])
    assert np.array_equal(g.logit_token_ids, e["logit_token_ids"])
    assert rel(g.adjacency_matrix, e["adjacency_matrix"], 1e-30) <= 1e-4
    # No memory for the rows or the patterns: a mapped file and recomputed patterns, the same graph.
    lean = burnlens.attribute(model, tc, np.array(case["ids"]), max_n_logits=case["max_n_logits"], desired_logit_prob=case["desired_logit_prob"],
                              batch_size=case["batch_size"], max_feature_nodes=case["max_feature_nodes"], pattern_memory_gb=0, rows_memory_gb=0)
    assert np.array_equal(lean.selected_features, g.selected_features)
    assert rel(lean.rows, g.rows, 1e-30) <= 1e-5
    p = g.prune(case["node_threshold"], case["edge_threshold"])
    assert np.array_equal(p["node_mask"], e["node_mask"].astype(bool))
    rows = [i for i in range(g.n_nodes) if i < len(g.selected_features) or i >= g.n_nodes - len(g.logit_token_ids)]
    assert np.array_equal(p["edge_mask"], e["edge_mask"].astype(bool)[rows])
    assert np.allclose(g.scores(), e["scores"], atol=1e-5)
    files = g.save(tmp_path / "graph")
    assert files[0].endswith("graph.safetensors") and "selected" in repr(g)
    with open(files[1]) as f:
        j = json.load(f)
    assert {"metadata", "qParams", "nodes", "links"} <= set(j) and j["metadata"]["prompt_tokens"][1] == "t17"


def test_bad_transcoders_raise_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        burnlens.Transcoders.load(str(tmp_path / "missing"))
    model = burnlens.HookedModel.from_pretrained(os.path.join(FIXTURES, "trace", "gpt2", "model"))
    tc = burnlens.Transcoders.load(os.path.join(FIXTURES, "trace", "gpt2", "transcoders"))
    with pytest.raises(ValueError, match="target token 999"):
        burnlens.attribute(model, tc, [1, 2, 3], targets=[999])
    # The keywords are the library's own option names: a misspelled one is named.
    with pytest.raises(ValueError, match="attribute options: unknown field `batch`"):
        burnlens.attribute(model, tc, [1, 2, 3], batch=3)


def test_feature_intervention_equals_circuit_tracers():
    case_dir = os.path.join(FIXTURES, "trace", "gpt2")
    with open(os.path.join(case_dir, "case.json")) as f:
        ids = json.load(f)["ids"]
    e = read_safetensors(os.path.join(case_dir, "intervention.safetensors"))
    model = burnlens.HookedModel.from_pretrained(os.path.join(case_dir, "model"))
    tc = burnlens.Transcoders.load(os.path.join(case_dir, "transcoders"))
    ivs = [(*map(int, i), float(v)) for i, v in zip(e["index"], e["value"])]
    logits, acts = burnlens.feature_intervention(model, tc, ids, ivs)
    assert logits.shape == e["logits"].shape and acts.shape == e["activations"].shape
    assert rel(logits, e["logits"], 1e-30) <= 1e-4
    assert rel(acts, e["activations"], 1e-30) <= 1e-4


def test_train_sae_on_a_corpus_then_evaluate_it(tmp_path):
    model = burnlens.HookedModel.from_pretrained(fixture("trained_gpt2_char"))
    seen = []
    summary = burnlens.train_sae(model, tmp_path / "run", data=fixture("data/corpus.jsonl"), seq_len=16, hook="blocks.1.hook_resid_pre",
                                 architecture="topk", k=4, d_sae=64, steps=8, batch=4, on_step=seen.append)
    assert summary["steps"] == 8 and len(seen) == 8
    assert seen[-1][0]["l0"] == 4.0 and [t for t, _ in seen[-1][0]["losses"]] == ["auxiliary_reconstruction_loss", "mse_loss"]
    sae = burnlens.SAE.load(summary["outputs"][0])
    assert sae.d_sae == 64
    m = burnlens.evaluate_sae(model, sae, data=fixture("data/corpus.jsonl"), seq_len=16, batches=2, batch_size=4)
    assert m["metrics"]["sparsity"]["l0"] <= 4.0
    assert m["metrics"]["token_stats"]["total_tokens_eval_sparsity_variance"] == 2 * 4 * 16
    assert len(m["feature_metrics"]["feature_density"]) == 64
    # The corpus options are the library's own (`prepend_bos` as SAELens names it; this
    # character model has no BOS, so it changes nothing here); a misspelled one is named.
    no_bos = burnlens.evaluate_sae(model, sae, data=fixture("data/corpus.jsonl"), seq_len=16, prepend_bos=False, batches=2, batch_size=4)
    assert no_bos["metrics"]["token_stats"]["total_tokens_eval_sparsity_variance"] == 2 * 4 * 16
    with pytest.raises(ValueError, match="seq_lenn"):
        burnlens.evaluate_sae(model, sae, data="random", seq_lenn=16)
    with pytest.raises(ValueError, match="stepz"):
        burnlens.train_sae(model, tmp_path / "bad", data="random", seq_len=16, hook="blocks.1.hook_resid_pre", stepz=3)


def test_train_sae_stops_when_on_step_raises_and_resumes(tmp_path):
    model = burnlens.HookedModel.from_pretrained(fixture("trained_gpt2_char"))
    opts = dict(data="random", seq_len=16, hook="blocks.0.hook_resid_pre", d_sae=32, steps=6, batch=2)

    def stop(reports):
        if reports[0]["step"] == 2:
            raise RuntimeError("enough")

    with pytest.raises(RuntimeError, match="enough"):
        burnlens.train_sae(model, tmp_path / "run", on_step=stop, **opts)
    assert (tmp_path / "run" / "checkpoints" / "LATEST").exists() and not (tmp_path / "run" / "sae").exists()
    summary = burnlens.train_sae(model, tmp_path / "run", **opts)
    assert summary["resumed_from"] == 3 and summary["steps"] == 6


def test_qk_rows_add_up_to_the_scores_and_refuse_bad_options():
    """burnlens.qk on circuit-tracer's GPT-2 fixture: a row per causal (query, key), its
    terms plus remainder equal to the model's own score (TransformerLens's attn_scores),
    as the `qk` command writes them; misspelled options and a head out of range raise."""
    model = burnlens.HookedModel.from_pretrained(fixture("trace/gpt2/model"))
    tc = burnlens.Transcoders.load(fixture("trace/gpt2/transcoders"))
    ids = np.array([1, 5, 9, 5, 9, 12])
    rows = burnlens.qk(model, tc, ids, layer=1, head=0, top_terms=3)
    assert len(rows) == 21 and all(len(r["terms"]) == 3 for r in rows)
    _, cache = model.run_with_cache(ids[None, :], names_filter="blocks.1.attn.hook_attn_scores")
    scores = np.asarray(cache["blocks.1.attn.hook_attn_scores"])[0, 0]
    for r in rows:
        total = sum(t["contribution"] for t in r["terms"]) + r["remainder"]
        assert abs(total - r["score"]) < 1e-4 and abs(r["score"] - scores[r["query"], r["key"]]) < 1e-4, r
    assert {"kind", "pos"} <= set(rows[-1]["terms"][0]["query_node"])
    plain = burnlens.qk(model, None, ids, layer=1, head=0, top_keys=1)
    assert len(plain) == 6 and any(t["key_node"]["kind"] == "mlp" for r in plain for t in r["terms"])
    with pytest.raises(ValueError, match="unknown field `top_term`"):
        burnlens.qk(model, tc, ids, layer=1, head=0, top_term=3)
    with pytest.raises(ValueError, match="head 9 is out of range"):
        burnlens.qk(model, tc, ids, layer=1, head=9)


def test_attribute_with_qk_saves_the_heads_of_the_edges_and_their_qk_rows(tmp_path):
    """attribute(..., qk=True): graph.attention() splits each kept edge that crosses
    positions into heads + rest + multi_hop = the edge's weight in graph.rows, its QK rows
    add up to their scores, and save() writes both into graph.json; without qk=True the
    saved graph has neither."""
    case_dir = os.path.join(FIXTURES, "trace", "gpt2")
    with open(os.path.join(case_dir, "case.json")) as f:
        ids = json.load(f)["ids"]
    model = burnlens.HookedModel.from_pretrained(os.path.join(case_dir, "model"))
    tc = burnlens.Transcoders.load(os.path.join(case_dir, "transcoders"))
    g = burnlens.attribute(model, tc, ids, qk=True)
    a = g.attention()
    assert a["loadings"] and a["qk"]
    n_logits, n_selected = len(g.logit_token_ids), len(g.selected_features)
    for e in a["loadings"]:
        row = e["target"] if e["target"] < n_selected else e["target"] - (g.n_nodes - n_logits) + n_selected
        assert abs(g.rows[row, e["source"]] - e["weight"]) <= 1e-6 * max(1.0, abs(e["weight"])), e
        total = sum(h["weight"] for h in e["heads"]) + e["rest"] + e["multi_hop"]
        assert abs(total - e["weight"]) <= 1e-4 * max(1.0, abs(e["weight"])), e
    for r in a["qk"]:
        assert abs(sum(t["contribution"] for t in r["terms"]) + r["remainder"] - r["score"]) < 1e-4, r
    with open(g.save(tmp_path / "qk")[1]) as f:
        j = json.load(f)
    assert len(j["qk"]) == len(a["qk"]) and sum("heads" in link for link in j["links"]) == len(a["loadings"])
    with open(burnlens.attribute(model, tc, ids).save(tmp_path / "plain")[1]) as f:
        j = json.load(f)
    assert "qk" not in j and not any("heads" in link for link in j["links"])


def test_train_sae_trains_a_cross_layer_transcoder_that_graph_reads(tmp_path):
    model = burnlens.HookedModel.from_pretrained(fixture("trace/gpt2/model"))
    summary = burnlens.train_sae(model, tmp_path / "run", data="random", seq_len=16, transcoders=True, cross_layer=True,
                                 architecture="jumprelu", l0=0.001, d_sae=24, steps=30, batch=4)
    tc = burnlens.Transcoders.load(summary["outputs"][0])
    assert summary["steps"] == 30 and "cross_layer_transcoder" in open(tmp_path / "run" / "transcoders" / "config.yaml").read()
    assert (tc.n_layers, tc.d_transcoder, tc.feature_input_hook) == (3, 24, "ln2.hook_normalized")


def test_dashboards_of_an_sae_and_of_transcoders_stop_resume_and_refuse_bad_input(tmp_path):
    import json as _json
    model = burnlens.HookedModel.from_pretrained(fixture("trained_gpt2_char"))
    sae = burnlens.SAE.load(fixture("sae/burnlens_topk_trained_gpt2_char"))
    seen = []
    s = burnlens.dashboards(model, tmp_path / "d", sae=sae, data=fixture("data/corpus.parquet"), seq_len=16, tokens=800, features="0-4",
                            on_progress=seen.append)
    assert (s["features"], s["tokens"], s["ran_out"]) == (5, 800, False)
    assert seen[-1]["pass"] == 2 and seen[-1]["tokens"] == seen[-1]["of"] == 1600
    f = _json.load(open(tmp_path / "d" / "features" / "3.json"))
    assert f["feature"] == 3 and len(f["top"]) == 20 and len(f["quantiles"]) == 10
    assert (tmp_path / "d" / "html" / "index.html").exists() and (tmp_path / "d" / "neuronpedia" / "batch-0.json").exists()

    tc = burnlens.Transcoders.load(fixture("trace/gpt2/transcoders"))
    tmodel = burnlens.HookedModel.from_pretrained(fixture("trace/gpt2/model"))

    def stop(p):
        if p["pass"] == 2:
            raise RuntimeError("enough")

    opts = dict(transcoders=tc, data="random", seq_len=16, tokens=640, batch=4, checkpoint_every=0.0)
    with pytest.raises(RuntimeError, match="enough"):
        burnlens.dashboards(tmodel, tmp_path / "t", on_progress=stop, **opts)
    assert (tmp_path / "t" / "checkpoints" / "LATEST").exists()
    s = burnlens.dashboards(tmodel, tmp_path / "t", **opts)
    assert s["resumed"][0] == 2 and s["features"] == 120
    with pytest.raises(ValueError, match="feature 96 does not exist"):
        burnlens.dashboards(model, tmp_path / "e", sae=sae, features="96")
    with pytest.raises(ValueError, match="unknown field `colour`"):
        burnlens.dashboards(model, tmp_path / "e", sae=sae, colour="red")


def test_train_sae_refuses_unknown_options_and_hooks(tmp_path):
    model = burnlens.HookedModel.from_pretrained(fixture("trained_gpt2_char"))
    with pytest.raises(ValueError, match="bogus"):
        burnlens.train_sae(model, tmp_path / "a", hook="blocks.0.hook_resid_pre", bogus=1)
    with pytest.raises(ValueError, match="blocks.9.hook_resid_pre"):
        burnlens.train_sae(model, tmp_path / "b", hook="blocks.9.hook_resid_pre", steps=1)
    assert not (tmp_path / "b").exists()
