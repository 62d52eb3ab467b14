"""burnlens from Python: transformers in Rust on Burn with TransformerLens's verbs.

    import burnlens
    model = burnlens.HookedModel.from_pretrained("tests/fixtures/gpt2")   # or "gpt2", "org/name@rev"
    logits, cache = model.run_with_cache(model.to_tokens("Hello world"))
    cache["pattern", 0]                  # == cache["blocks.0.attn.hook_pattern"]

Everything returns numpy arrays (float32 activations, int64 tokens); the compute runs in Rust
with the GIL released. Names, shapes and meanings follow TransformerLens where it has them
(hook names, `W_Q [n_layers, n_heads, d_model, d_head]`, `decompose_resid`, ...). Errors are
Python exceptions carrying the CLI's one-line messages: `FileNotFoundError` for a missing
model, `KeyError` for an unknown hook name, `ValueError` for bad input.

Unlike TransformerLens's `from_pretrained`, weights are not processed unless asked
(`process_weights=True`), so the numbers are those of the checkpoint, as `transformers` and the
burnlens CLI compute them.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native

__all__ = ["HookedModel", "ActivationCache", "HookPoint", "Config", "SAE", "Transcoders", "Graph", "attribute", "feature_intervention", "qk", "train", "train_sae",
           "evaluate_sae", "dashboards", "get_act_name", "backends", "set_compute_dtype", "compute_dtype"]

Tokens = Union[str, Sequence[str], np.ndarray, Sequence[int], Sequence[Sequence[int]]]
HookFn = Callable[[np.ndarray, "HookPoint"], Optional[np.ndarray]]
NamesFilter = Union[None, str, Sequence[str], Callable[[str], bool]]


def backends() -> List[str]:
    """The backends compiled into this build (`flex` and `ndarray` by default)."""
    return _native.backends()


def set_compute_dtype(dtype: Any) -> None:
    """The arithmetic of the products for this process: `"f32"` (default, exact, on a GPU
    too), `"bf16"` (`torch.bfloat16` accepted by name): operands rounded to bf16, sums in
    f32, as `torch.autocast`; or `"tf32"`: a GPU's tensor cores take f32 products as TF32
    (f32 on the CPU). Activations, hooks and results stay float32."""
    _native.set_compute_dtype(_dtype_name(dtype))


def compute_dtype() -> str:
    """The compute dtype in force, `"f32"`, `"bf16"` or `"tf32"`."""
    return _native.compute_dtype()


def get_act_name(name: str, layer: Optional[int] = None, sub: Optional[str] = None) -> str:
    """TransformerLens's short names: `("pattern", 0)` -> `blocks.0.attn.hook_pattern`,
    `("resid_pre", 3)`, `("post", 1)` -> `blocks.1.mlp.hook_post`, `("scale", 2, "ln1")` ->
    `blocks.2.ln1.hook_scale`, `"embed"` -> `hook_embed`. Full names pass through."""
    return _native.get_act_name(name, layer, sub)


class HookPoint:
    """What a hook function receives beside the activation: `hook.name`, `hook.layer()`."""

    def __init__(self, name: str):
        self.name = name

    def layer(self) -> Optional[int]:
        return _native.hook_layer(self.name)

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r})"


Config = _native.Config


class ActivationCache:
    """Activations by hook name (`cache["blocks.0.attn.hook_pattern"]`, `cache["pattern", 0]`),
    with TransformerLens's residual-stream views. Arrays have a leading batch dimension."""

    def __init__(self, acts: Dict[str, np.ndarray], model: "HookedModel", tokens: np.ndarray, padded: bool):
        self.cache_dict = acts
        self.model = model
        self.tokens = tokens
        self._padded = padded

    def _key(self, key: Union[str, Tuple]) -> str:
        return get_act_name(*key) if isinstance(key, tuple) else get_act_name(key)

    def __getitem__(self, key: Union[str, Tuple]) -> np.ndarray:
        name = self._key(key)
        if name not in self.cache_dict:
            known = name in self.model._names
            raise KeyError(f'"{name}" is {"not in this cache (filtered out by names_filter)" if known else "not a hook point of this model"}')
        return self.cache_dict[name]

    def __contains__(self, key: Union[str, Tuple]) -> bool:
        try:
            return self._key(key) in self.cache_dict
        except KeyError:
            return False

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def keys(self):
        return self.cache_dict.keys()

    def values(self):
        return self.cache_dict.values()

    def items(self):
        return self.cache_dict.items()

    def _per_sequence(self, kind: str, layer: Optional[int]) -> Tuple[List[str], np.ndarray]:
        if self._padded:
            raise ValueError("residual decompositions of a padded batch are not supported; run each sequence alone")
        return _native.residual(self.model._native, self.tokens, kind, layer)  # [components, batch, pos, d_model]

    def decompose_resid(self, layer: Optional[int] = None, return_labels: bool = False):
        """The residual stream entering `layer` (after the last layer with `None`) as the
        embeddings plus each earlier attention and MLP output: `[components, batch, pos, d_model]`."""
        labels, stack = self._per_sequence("decompose", layer)
        return (stack, labels) if return_labels else stack

    def stack_head_results(self, layer: Optional[int] = None, return_labels: bool = False):
        """Every head's result (`z_h W_O[h]`, without `b_O`) of the layers before `layer`:
        `[layer * heads, batch, pos, d_model]`, labelled `L{l}H{h}`. Where a norm follows
        attention (Gemma, OLMo 2) each result passes through it with its scale frozen."""
        labels, stack = self._per_sequence("heads", layer)
        return (stack, labels) if return_labels else stack

    def accumulated_resid(self, layer: Optional[int] = None, incl_mid: bool = False, apply_ln: bool = False, return_labels: bool = False):
        """The residual stream entering each layer up to `layer` (and after the last with
        `None`): `[n, batch, pos, d_model]`, labelled `{l}_pre`, `{l}_mid`, `final_post`; with
        `apply_ln` the final norm is recomputed on each (the logit lens's input)."""
        labels, stack = _native.accumulated_resid(self.model._native, self.cache_dict, layer, incl_mid, apply_ln)
        return (stack, labels) if return_labels else stack

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self.cache_dict)}"


class HookedModel:
    """A model with TransformerLens's verbs. Load with :meth:`from_pretrained`."""

    def __init__(self, native: "_native.NativeModel", dropped: Sequence[str] = ()):
        self._native = native
        self.cfg = native.config()
        self._names: List[str] = native.hook_names()
        self._hooks: List[Tuple[str, HookFn]] = []
        self._weights: Optional[Dict[str, np.ndarray]] = None
        self.processing_dropped: List[str] = list(dropped)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, name: str, backend: Optional[str] = None, process_weights: bool = False, dtype: Optional[str] = None,
                        compute_dtype: Optional[str] = None) -> "HookedModel":
        """Load a `save_pretrained` directory, a burnlens run directory or a Hub id
        (`gpt2`, `org/name@revision`). `backend`: `flex` (default), `ndarray`, or a GPU backend
        compiled in. `process_weights=True` folds norms and centres weights as
        TransformerLens's `from_pretrained` does (steps the architecture cannot take are
        dropped and listed in `processing_dropped`). `dtype`: what the weight matrices are
        kept in, `"auto"` (default: as the checkpoint stores them, so a bf16 model takes
        half the memory), `"f32"`, `"bf16"` or `"f16"` (`torch.bfloat16` and friends are
        accepted by name); activations and results are float32 either way. `compute_dtype`:
        the arithmetic of the linear layers' products, `"f32"` (exact) or `"bf16"` (operands
        rounded to bf16, sums in f32: faster on CPUs with AVX512_BF16), set for the whole
        process (`burnlens.set_compute_dtype`)."""
        native = _native.NativeModel.load(str(name), backend, _dtype_name(dtype), _dtype_name(compute_dtype))
        if process_weights:
            native, dropped = native.processed()
            return cls(native, dropped)
        return cls(native)

    @classmethod
    def from_pretrained_no_processing(cls, name: str, backend: Optional[str] = None, dtype: Optional[str] = None) -> "HookedModel":
        """:meth:`from_pretrained` without weight processing (the default here)."""
        return cls.from_pretrained(name, backend, dtype=dtype)

    def hook_names(self) -> List[str]:
        """Every hook point, in the order a forward pass visits them."""
        return list(self._names)

    # --------------------------------------------------------------- tokenizing

    def to_tokens(self, text: Union[str, Sequence[str]], prepend_bos: bool = True) -> np.ndarray:
        """`[batch, pos]` int64 token ids; a list of texts is right-padded (pass the list
        itself to the model to get the matching attention mask)."""
        tokens, _ = self._tokens_and_mask(text, prepend_bos)
        return tokens

    def _tokens_and_mask(self, x: Tokens, prepend_bos: bool = True) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        if isinstance(x, str):
            x = [x]
        if isinstance(x, (list, tuple)) and x and all(isinstance(s, str) for s in x):
            # The library's encoder (the CLI's): BOS first, right-padded, with the mask.
            return self._native.encode_batch(list(x), prepend_bos)
        arr = np.asarray(x)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"tokens: expected integer token ids, found dtype {arr.dtype}")
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2:
            raise ValueError(f"tokens: expected [batch, pos] (or [pos]) token ids, found shape {arr.shape}")
        return np.ascontiguousarray(arr, dtype=np.int64), None

    def to_str_tokens(self, x: Union[str, Sequence[int], np.ndarray], prepend_bos: bool = True) -> List[str]:
        """Each token of one sequence as text."""
        tokens, _ = self._tokens_and_mask(x, prepend_bos)
        if tokens.shape[0] != 1:
            raise ValueError("to_str_tokens takes one sequence")
        return [self._native.decode([int(t)]) for t in tokens[0]]

    def to_string(self, tokens: Union[Sequence[int], np.ndarray]) -> Union[str, List[str]]:
        """The text of `[pos]` tokens (a list of texts for `[batch, pos]`)."""
        arr = np.asarray(tokens)
        if arr.ndim == 2:
            return [self._native.decode([int(t) for t in row]) for row in arr]
        return self._native.decode([int(t) for t in arr])

    # ------------------------------------------------------------------ running

    def _names_from(self, filt: NamesFilter) -> List[str]:
        if filt is None:
            return list(self._names)
        if isinstance(filt, str):
            filt = [filt]
        if callable(filt):
            return [n for n in self._names if filt(n)]
        # The native calls check the names against the model's (one message, the CLI's).
        return [get_act_name(n) for n in filt]

    def _expand_hooks(self, hooks: Iterable[Tuple[Union[str, Callable[[str], bool]], HookFn]]) -> List[Tuple[str, Any]]:
        out = []
        for name, fn in hooks:
            names = [n for n in self._names if name(n)] if callable(name) else self._names_from([name])
            for n in names:
                out.append((n, _wrap(fn)))
        return out

    def _run(self, x: Tokens, attention_mask: Optional[np.ndarray], capture: List[str], hooks: List[Tuple[str, HookFn]], return_type: Optional[str]):
        """Tokens, mask, what `return_type` asks for, and the captured activations."""
        wants_loss = _wants_loss(return_type)
        tokens, mask = self._tokens_and_mask(x)
        if attention_mask is not None:
            mask = np.ascontiguousarray(np.asarray(attention_mask, dtype=bool))
        all_hooks = self._expand_hooks(self._hooks) + self._expand_hooks(hooks)
        logits, acts, loss = self._native.run(tokens, mask, capture, all_hooks, wants_loss)
        return tokens, mask, _output(logits, loss, return_type), acts

    def __call__(self, x: Tokens, return_type: Optional[str] = "logits", attention_mask: Optional[np.ndarray] = None):
        """Logits `[batch, pos, d_vocab]` (float32) of text, texts (padded, with the attention
        mask) or token ids; `return_type="loss"` gives the mean next-token cross-entropy,
        `"both"` the pair."""
        return self._run(x, attention_mask, [], [], return_type)[2]

    forward = __call__

    def run_with_cache(self, x: Tokens, names_filter: NamesFilter = None, return_type: Optional[str] = "logits", attention_mask: Optional[np.ndarray] = None):
        """`(logits, cache)`: the activations at every hook point `names_filter` selects (a
        name, a list of names or short names, or a predicate; all with `None`)."""
        names = self._names_from(names_filter)
        tokens, mask, out, acts = self._run(x, attention_mask, names, [], return_type)
        return out, ActivationCache(acts, self, tokens, mask is not None)

    def run_with_hooks(self, x: Tokens, fwd_hooks: Sequence[Tuple[Union[str, Callable[[str], bool]], HookFn]] = (), return_type: Optional[str] = "logits", attention_mask: Optional[np.ndarray] = None):
        """Run with `fn(activation, hook)` at each `(name, fn)` of `fwd_hooks` (a name or a
        predicate over names); what `fn` returns (same shape) replaces the activation, `None`
        keeps it."""
        return self._run(x, attention_mask, [], list(fwd_hooks), return_type)[2]

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[Tuple[Union[str, Callable[[str], bool]], HookFn]] = ()):
        """`with model.hooks(fwd_hooks=[...]):` — the hooks apply to every call inside."""
        added = list(fwd_hooks)
        self._expand_hooks(added)  # unknown names fail here, not at the first call
        self._hooks.extend(added)
        try:
            yield self
        finally:
            for h in added:
                self._hooks.remove(h)

    def add_hook(self, name: Union[str, Callable[[str], bool]], fn: HookFn) -> None:
        """Keep `fn` at `name` for every later call (until :meth:`reset_hooks`)."""
        self._expand_hooks([(name, fn)])
        self._hooks.append((name, fn))

    def reset_hooks(self) -> None:
        self._hooks.clear()

    def run_with_saes(self, x: Tokens, saes: Sequence["SAE"], return_type: Optional[str] = "logits"):
        """Logits with each SAE's reconstruction in place of the activation it reads."""
        tokens, mask = self._tokens_and_mask(x)
        if mask is not None:
            raise ValueError("run_with_saes takes sequences of one length (no padding)")
        logits, loss = self._native.run_with_saes(tokens, list(saes), _wants_loss(return_type))
        return _output(logits, loss, return_type)

    def generate(self, x: Union[str, Sequence[int], np.ndarray], max_new_tokens: int = 10, temperature: float = 0.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, seed: int = 0, stop_token: Optional[int] = None, prepend_bos: bool = True):
        """The prompt continued by up to `max_new_tokens` tokens (greedy at temperature 0, with
        the KV cache): a string for a string prompt, else the token ids (prompt included)."""
        tokens, _ = self._tokens_and_mask(x, prepend_bos)
        if tokens.shape[0] != 1:
            raise ValueError("generate takes one prompt")
        prompt = [int(t) for t in tokens[0]]
        new = self._native.generate(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop_token)
        if isinstance(x, str):
            return self._native.decode(prompt[1:] + new if prepend_bos and self._native.bos_token_id is not None else prompt + new)
        return np.array(prompt + new, dtype=np.int64)

    # ------------------------------------------------------------- attribution

    def _one(self, x) -> List[int]:
        tokens, mask = self._tokens_and_mask(x)
        if tokens.shape[0] != 1:
            raise ValueError("this tool takes one sequence")
        return [int(t) for t in tokens[0]]

    def metric(self, x, metric: str) -> float:
        """`loss[:FROM]`, `logprob:TOKEN[@POS]` or `logit-diff:RIGHT,WRONG[@POS]` on one sequence
        (TOKEN: an id, or the text of one token)."""
        return self._native.metric_value(self._one(x), metric)

    def hook_gradients(self, x, names: NamesFilter, metric: str) -> Dict[str, np.ndarray]:
        """The metric's gradient at each selected hook point (one sequence): arrays shaped
        like the activations."""
        _, grads, _ = self._native.hook_gradients(self._one(x), self._names_from(names), metric)
        return grads

    def patching(self, clean, corrupted, metric: str, kinds: Sequence[str] = ("head",), method: str = "activation") -> Dict[str, Any]:
        """Patch each node of `kinds` (`head`: `hook_z` per head, `resid_pre`: per position,
        `mlp`: `hook_mlp_out`) from `corrupted` into `clean` (`method="activation"`) or its
        linear estimate (`"attribution"`): the clean metric and, per kind, the metric's change,
        `head` `[layers, heads]`, `resid_pre` `[layers, pos]`, `mlp` `[layers]`."""
        if method not in ("activation", "attribution"):
            raise ValueError(f'method "{method}": expected "activation" or "attribution"')
        return _native.patching(self._native, self._one(clean), self._one(corrupted), metric, list(kinds), method == "attribution")

    def logit_lens(self, x, k: int = 5, target: Optional[int] = None) -> Dict[str, Any]:
        """Each layer's residual stream read through the final norm and the unembedding: the
        top `k` tokens with probabilities per layer and position, and the target's."""
        return _native.logit_lens(self._native, self._one(x), k, target)

    def logit_attribution(self, x, right: int, wrong: Optional[int] = None) -> Dict[str, Any]:
        """Direct logit attribution of `logit[right]` (minus `logit[wrong]`) at every position:
        `labels`, `contributions` `[component, pos]`, `bias`, `logits`, `max_error`. Under a
        final soft-cap (Gemma 2) the sum is the logit before the cap."""
        return _native.logit_attribution(self._native, self._one(x), right, wrong)

    # ------------------------------------------------------------------ weights

    @property
    def weights(self) -> Dict[str, np.ndarray]:
        if self._weights is None:
            self._weights = dict(self._native.weights())
        return self._weights

    def _w(self, name: str) -> np.ndarray:
        w = self.weights
        if name not in w:
            raise AttributeError(f"this model has no {name}")
        return w[name]

    W_E = property(lambda self: self._w("W_E"), doc="`[d_vocab, d_model]`")
    W_pos = property(lambda self: self._w("W_pos"), doc="`[n_ctx, d_model]` (learned positions only)")
    W_U = property(lambda self: self._w("W_U"), doc="`[d_model, d_vocab]`")
    b_U = property(lambda self: self._w("b_U") if "b_U" in self.weights else np.zeros(self.cfg.d_vocab, np.float32), doc="`[d_vocab]`")
    W_Q = property(lambda self: self._w("W_Q"), doc="`[n_layers, n_heads, d_model, d_head]`")
    W_K = property(lambda self: self._w("W_K"), doc="`[n_layers, n_heads, d_model, d_head]` (grouped heads repeated)")
    W_V = property(lambda self: self._w("W_V"), doc="`[n_layers, n_heads, d_model, d_head]` (grouped heads repeated)")
    W_O = property(lambda self: self._w("W_O"), doc="`[n_layers, n_heads, d_head, d_model]`")
    b_Q = property(lambda self: self._w("b_Q"), doc="`[n_layers, n_heads, d_head]`")
    b_K = property(lambda self: self._w("b_K"), doc="`[n_layers, n_heads, d_head]`")
    b_V = property(lambda self: self._w("b_V"), doc="`[n_layers, n_heads, d_head]`")
    b_O = property(lambda self: self._w("b_O"), doc="`[n_layers, d_model]`")
    W_in = property(lambda self: self._w("W_in"), doc="`[n_layers, d_model, d_mlp]`")
    W_gate = property(lambda self: self._w("W_gate"), doc="`[n_layers, d_model, d_mlp]` (gated MLPs)")
    W_out = property(lambda self: self._w("W_out"), doc="`[n_layers, d_mlp, d_model]`")
    b_in = property(lambda self: self._w("b_in"), doc="`[n_layers, d_mlp]`")
    b_out = property(lambda self: self._w("b_out"), doc="`[n_layers, d_model]`")

    def apply_ln_final(self, x: np.ndarray) -> np.ndarray:
        """The final norm (recomputed on `x`, `[..., d_model]`)."""
        return self._native.apply_ln_final(np.ascontiguousarray(x, dtype=np.float32))

    def __repr__(self) -> str:
        return f"HookedModel({self._native.directory!r}, {self.cfg!r})"


def _dtype_name(dtype: Any) -> Optional[str]:
    """`torch.bfloat16` (or `numpy.float32`, or a plain name) as the native loader spells it;
    the loader itself checks the name."""
    if dtype is None:
        return None
    name = dtype if isinstance(dtype, str) else getattr(dtype, "__name__", None) or str(dtype)
    return name.rsplit(".", 1)[-1]


def _wrap(fn: HookFn):
    return lambda act, name: fn(act, HookPoint(name))


def _wants_loss(return_type: Optional[str]) -> bool:
    if return_type not in ("logits", "loss", "both", None):
        raise ValueError(f'return_type "{return_type}": expected "logits", "loss", "both" or None')
    return return_type in ("loss", "both")


def _output(logits: np.ndarray, loss: Optional[float], return_type: Optional[str]):
    """What `return_type` asks for: the logits, the mean next-token loss (computed by the
    library over real tokens), both, or nothing."""
    if return_type == "logits":
        return logits
    if return_type == "loss":
        return loss
    if return_type == "both":
        return logits, loss
    return None


SAE = _native.SAE
Transcoders = _native.Transcoders
Graph = _native.Graph


def attribute(model: "HookedModel", transcoders: Transcoders, prompt: Union[str, Sequence[int], np.ndarray],
              targets: Optional[Sequence[int]] = None, qk: bool = False, **options: Any) -> Graph:
    """circuit-tracer's `attribute`: the attribution graph of one prompt. Text gets the
    model's BOS first; token ids are attributed as given. `targets`: explain these next
    tokens instead of the most probable ones. `options` are the `graph` command's flags with
    underscores, with circuit-tracer's defaults: `max_n_logits` (10), `desired_logit_prob`
    (0.95), `batch_size` (512), `max_feature_nodes` (all), `update_interval` (4),
    `zero_positions` (1); attention patterns are kept while they fit `pattern_memory_gb` (4,
    else recomputed), the adjacency rows stay in memory while they fit `rows_memory_gb` (8,
    else they live in a mapped temporary file under TMPDIR). `qk=True`: `graph.save` adds the
    attention side as `graph --qk` does (which heads carry the edges that cross positions,
    and their QK attributions); `graph.attention()` returns it either way."""
    return _native.attribute(model._native, transcoders, _prompt_tokens(model, prompt), None if targets is None else [int(t) for t in targets],
                             json.dumps(options), bool(qk))


def _prompt_tokens(model: "HookedModel", prompt: Union[str, Sequence[int], np.ndarray]) -> List[int]:
    """Text with the model's BOS first, or one sequence of token ids as given."""
    if isinstance(prompt, str):
        tokens = model.to_tokens(prompt)[0]
    else:
        tokens = np.asarray(prompt)
        if tokens.ndim == 2 and tokens.shape[0] == 1:
            tokens = tokens[0]
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"prompt: expected text or one sequence of token ids, found {tokens.dtype} of shape {tokens.shape}")
    return [int(t) for t in tokens]


def qk(model: "HookedModel", transcoders: Optional[Transcoders], prompt: Union[str, Sequence[int], np.ndarray], layer: int, head: int,
       **options: Any) -> List[Dict[str, Any]]:
    """QK attributions of one head: why it attends where it does. For every (query, key) it
    attends, the model's pre-softmax score (before any soft-cap) written exactly as a sum
    of terms over pairs of parts of the two residual streams (transcoder features, error
    nodes, tokens, earlier heads' outputs, skip terms, constants; with `transcoders=None`
    each MLP's output is one part; norm scales frozen as in attribution graphs). Returns the `qk` command's rows: dicts with `layer`, `head`,
    `query`, `key`, `score`, `pattern`, `terms` (`query_node`, `key_node`, `contribution`;
    the largest first), `remainder` (the rest), `feature_feature`, `error`, `other`.
    Text gets the model's BOS first; token ids are used as given. `options`: `top_terms`
    (10), `min_pattern` (0), `top_keys` (all), `zero_positions` (1)."""
    return _native.qk(model._native, transcoders, _prompt_tokens(model, prompt), json.dumps(dict(options, layer=layer, head=head)))


def feature_intervention(model: "HookedModel", transcoders: Transcoders, prompt: Union[str, Sequence[int], np.ndarray],
                         interventions: Sequence[Tuple[int, int, int, float]], freeze_attention: bool = True,
                         zero_positions: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """circuit-tracer's `feature_intervention`: set each `(layer, pos, feature, value)` and
    return the new `logits [pos, vocab]` and feature `activations [layer, pos, features]`."""
    tokens = model.to_tokens(prompt)[0] if isinstance(prompt, str) else np.asarray(prompt).reshape(-1)
    ivs = [(int(l), int(p), int(f), float(v)) for l, p, f, v in interventions]
    return _native.feature_intervention(model._native, transcoders, [int(t) for t in tokens], ivs, bool(freeze_attention), int(zero_positions))


def train(config_path: str, overrides: Optional[Dict[str, Any]] = None, on_step: Optional[Callable[[Dict[str, Any]], None]] = None, resume: bool = False) -> str:
    """Train as the run config says (`overrides`: `{"training.steps": 100, ...}` as the CLI's
    `--set`); `on_step(metrics)` after every optimizer step (`step`, `loss`, `lr`,
    `grad_norm`, `tokens_per_s`); an exception it raises stops the run (checkpointed) and is
    re-raised. Returns the run directory."""
    return _native.train(str(config_path), json.dumps(overrides or {}), on_step, resume)


def _options(options: Dict[str, Any]) -> str:
    """Keyword options as JSON, with the library's own names; paths as strings."""
    return json.dumps({k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items()})


def train_sae(model: "HookedModel", out: str, *, on_step: Optional[Callable[[List[Dict[str, Any]]], None]] = None, **options: Any) -> Dict[str, Any]:
    """Train SAEs as SAELens trains them on `model`'s activations, streamed from a corpus.
    `options` are `train-sae`'s flags with underscores. The corpus's: `data` (`"random"`,
    `"repeated"`, a .txt/.jsonl/.parquet file or folder, or a Hub dataset
    `org/name[@rev][:split]`), `column`, `seq_len` (tokens per window), `prepend_bos`. The
    run's: `hook="blocks.1.hook_resid_pre"` (or several, comma-separated) or
    `transcoders=True` (one per layer, `skip=True` for W_skip), `architecture` (standard, topk,
    batchtopk, jumprelu), `k`, `l1` (standard) or `l0` (jumprelu), `d_sae`, `steps`, `batch`,
    `lr`, `seed`, ... The run lives in `out` (run again to resume); `on_step(reports)` gets
    each step's loss terms per site, and an exception it raises stops the run after a
    checkpoint and is raised again. Returns the summary (`outputs`: the SAE or transcoder
    folders written)."""
    return _native.train_sae(model._native, str(out), _options(options), on_step)


def evaluate_sae(model: "HookedModel", sae: "SAE", *, batches: int = 10, batch_size: int = 8, seed: int = 0, **corpus: Any) -> Dict[str, Any]:
    """SAELens's `run_evals` metrics of `sae` over `batches` batches of `batch_size` windows of
    the corpus `corpus` names (`data`, `column`, `seq_len`, `prepend_bos`, as `train_sae`
    reads them), BOS left out: `{"metrics": {...}, "feature_metrics": {...}}` with SAELens's
    names and nesting."""
    return _native.evaluate_sae(model._native, sae, _options(corpus), int(batches), int(batch_size), int(seed))


def dashboards(model: "HookedModel", out: str, *, sae: Optional["SAE"] = None, transcoders: Optional[Transcoders] = None,
               on_progress: Optional[Callable[[Dict[str, Any]], None]] = None, **options: Any) -> Dict[str, Any]:
    """Feature dashboards as SAEDashboard makes them, for every feature of `sae` or of
    `transcoders` (each layer's) over a corpus (`data`, `column`, `seq_len`, `prepend_bos`,
    as `train_sae` reads it), written into `out`: `html/index.html` (an offline browser),
    `neuronpedia/` (Neuronpedia's batch JSON), `circuit-tracer/` (its local feature files)
    and `features/` (burnlens's JSON per feature). The other `options` are the `dashboards`
    command's flags with underscores: `tokens`, `features` ("0-99,512"), `top_k`,
    `quantiles`, `quantile_size`, `before`, `after`, `whole_window`, `keep_bos`, `batch`,
    `checkpoint_every`, `seed`. Running again resumes an interrupted job; `on_progress(p)`
    gets `pass`, `tokens`, `of`, `tokens_per_s` and `seconds_left`, and an exception it raises
    stops the job after a checkpoint and is raised again. Returns the summary (`features`,
    `tokens`, `ran_out`, `seconds`, `index`)."""
    return _native.dashboards(model._native, str(out), _options(options), sae, transcoders, on_progress)
