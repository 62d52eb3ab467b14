//! Weight processing (as TransformerLens's `from_pretrained` options), each step leaving
//! the model's log-probabilities unchanged:
//! - **fold LayerNorm**: fold each LayerNorm's gain and bias into the weights that read its
//!   output (Q/K/V, MLP input and gate, unembedding) and centre those reading weights,
//!   leaving LayerNorms that only centre and scale; an RMSNorm's gain is folded the same way
//!   (it has no bias, and its output is not mean-free, so nothing is centred);
//! - **centre writing weights**: remove the mean over `d_model` of everything that writes to
//!   the residual stream (`W_E`, `W_pos`, `W_O`, `b_O`, MLP output) — every reader applies a
//!   LayerNorm, which removes it anyway; skipped for RMSNorm models, where it would change
//!   the model (TransformerLens skips it too);
//! - **centre the unembedding**: remove the mean over the vocabulary of `W_U` and `b_U` —
//!   a constant added to every logit leaves the softmax unchanged;
//! - **fold value biases**: pattern rows sum to one, so `b_V` contributes the constant
//!   `Σ_h b_V[h] W_O[h]` to the output; move it into `b_O`.
//!
//! Any step unties the unembedding from the embedding (they no longer agree afterwards).
//! Gemma's norms after attention and the MLP (`ln1_post`, `ln2_post`) and the QK-norms stay
//! as they are: nothing linear reads their output before the next norm.

use std::collections::HashMap;

use burn::tensor::TensorData;
use burn_store::{ModuleSnapshot, bridge};
use burnlens_model::{ModelError, ParamInit, Transformer, TransformerConfig};

/// Which processing steps to apply; all off by default.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessOptions {
    pub fold_ln: bool,
    pub center_writing_weights: bool,
    pub center_unembed: bool,
    pub fold_value_biases: bool,
}

impl ProcessOptions {
    /// Everything, as TransformerLens's `from_pretrained` does by default.
    pub fn all() -> Self {
        Self { fold_ln: true, center_writing_weights: true, center_unembed: true, fold_value_biases: true }
    }

    /// The steps of `self` that `cfg` allows, and why each dropped one cannot apply
    /// (TransformerLens drops them the same way): no fold after post-norms (OLMo 2), no
    /// centring of the unembedding under logit soft-capping (Gemma 2).
    pub fn allowed_for(self, cfg: &burnlens_model::TransformerConfig) -> (Self, Vec<String>) {
        let mut opts = self;
        let mut dropped = Vec::new();
        if opts.fold_ln
            && let Err(e) = (Self { fold_ln: true, ..Default::default() }).check(cfg)
        {
            opts.fold_ln = false;
            dropped.push(e.to_string());
        }
        if opts.center_unembed
            && let Err(e) = (Self { center_unembed: true, ..Default::default() }).check(cfg)
        {
            opts.center_unembed = false;
            dropped.push(e.to_string());
        }
        (opts, dropped)
    }

    /// Whether every step of `self` leaves a model of architecture `cfg` unchanged.
    pub fn check(&self, cfg: &burnlens_model::TransformerConfig) -> Result<(), ModelError> {
        if self.fold_ln && cfg.positional == burnlens_model::Positional::QueryKeyOnly {
            // q = (ln1(x) + pos) W_Q: the LayerNorm scale cannot move into W_Q without also
            // scaling the position term, so folding would change the model.
            return Err(ModelError::Config {
                field: "positional",
                msg: "is query_key_only (shortformer): LayerNorm cannot be folded into W_Q/W_K without changing the position term; process without fold_ln"
                    .into(),
            });
        }
        if self.fold_ln && cfg.norm_placement == burnlens_model::NormPlacement::Post {
            return Err(ModelError::Config {
                field: "norm_placement",
                msg:
                    "is post (OLMo 2): the block norms follow attention and the MLP, so no weights read their output to fold them into; process without fold_ln"
                        .into(),
            });
        }
        if self.center_unembed && cfg.final_softcap.is_some() {
            return Err(ModelError::Config {
                field: "final_softcap",
                msg: "is set (Gemma 2): soft-capped logits change when a constant is added to every logit, so the unembedding cannot be centred; process without center_unembed".into(),
            });
        }
        Ok(())
    }

    fn any(&self) -> bool {
        self.fold_ln || self.center_writing_weights || self.center_unembed || self.fold_value_biases
    }
}

/// A parameter on the host: shape and row-major values.
struct P {
    shape: Vec<usize>,
    v: Vec<f64>,
}

impl P {
    fn rows(&self) -> usize {
        self.shape[0]
    }
    fn cols(&self) -> usize {
        self.shape[1]
    }
}

/// Subtract each row's mean (`[rows, cols]`).
fn center_rows(p: &mut P) {
    let c = p.cols();
    for row in p.v.chunks_mut(c) {
        let mean = row.iter().sum::<f64>() / c as f64;
        row.iter_mut().for_each(|x| *x -= mean);
    }
}

/// Subtract each column's mean (`[rows, cols]`).
fn center_cols(p: &mut P) {
    let (r, c) = (p.rows(), p.cols());
    for j in 0..c {
        let mean = (0..r).map(|i| p.v[i * c + j]).sum::<f64>() / r as f64;
        (0..r).for_each(|i| p.v[i * c + j] -= mean);
    }
}

fn center(v: &mut [f64]) {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    v.iter_mut().for_each(|x| *x -= mean);
}

/// Fold norm `ln` into the readers `(w [d, out], b [out])`; for a LayerNorm (`centred`) also
/// its bias, and centre each `w` over `d`. The norm becomes gain 1 (bias 0).
fn fold_into(params: &mut HashMap<String, P>, ln: &str, readers: &[(String, String)], centred: bool) {
    let gain = params.remove(&format!("{ln}.weight")).expect("norm weight");
    let d = gain.v.len();
    let shift = params.remove(&format!("{ln}.bias")).map(|p| p.v).unwrap_or_else(|| vec![0.0; d]);
    for (w, b) in readers {
        let mut weight = params.remove(w).expect("reader weight");
        let out = weight.cols();
        let mut bias = params.remove(b).unwrap_or(P { shape: vec![out], v: vec![0.0; out] });
        for j in 0..out {
            bias.v[j] += (0..d).map(|i| shift[i] * weight.v[i * out + j]).sum::<f64>();
        }
        for i in 0..d {
            (0..out).for_each(|j| weight.v[i * out + j] *= gain.v[i]);
        }
        if centred {
            center_cols(&mut weight);
        }
        params.insert(w.clone(), weight);
        params.insert(b.clone(), bias);
    }
    params.insert(format!("{ln}.weight"), P { shape: vec![d], v: vec![1.0; d] });
    if centred {
        params.insert(format!("{ln}.bias"), P { shape: vec![d], v: vec![0.0; d] });
    }
}

/// Apply `opts` to `model`, returning a new model on the same device.
pub fn process_weights(model: &Transformer, opts: ProcessOptions) -> Result<Transformer, ModelError> {
    let mut cfg = model.config.clone();
    if !opts.any() {
        return Ok(model.clone());
    }
    opts.check(&cfg)?;
    let mut params = read_params(model);
    let layer_norm = cfg.norm == burnlens_model::NormKind::LayerNorm;
    add_zero_biases(&mut params, &mut cfg);
    untie(&mut params, &mut cfg);
    if opts.fold_ln {
        fold_layer_norms(&mut params, &cfg, layer_norm);
    }
    if opts.center_writing_weights && layer_norm {
        center_writing_weights(&mut params, &cfg);
    }
    if opts.center_unembed {
        center_rows(params.get_mut("unembed.weight").expect("W_U"));
        center(&mut params.get_mut("unembed.bias").expect("b_U").v);
    }
    if opts.fold_value_biases {
        fold_value_biases(&mut params, &cfg);
    }
    cfg.build(&model.device(), |name, shape, _| {
        let p = params.remove(name).unwrap_or_else(|| panic!("processed weights lack `{name}`"));
        debug_assert_eq!(p.shape, shape);
        let v: Vec<f32> = p.v.into_iter().map(|x| x as f32).collect();
        Ok::<_, ModelError>(ParamInit::Data(TensorData::new(v, p.shape)))
    })
}

/// Every parameter by name, in f64.
fn read_params(model: &Transformer) -> HashMap<String, P> {
    model
        .collect(None, None, false)
        .into_iter()
        .map(|t| {
            let name = t.name.clone();
            let data = bridge::into_data(t).expect("parameter readable");
            let shape = data.shape().to_vec();
            let v = data.try_into_vec_as::<f32>().expect("float").into_iter().map(f64::from).collect();
            (name, P { shape, v })
        })
        .collect()
}

/// Every optional bias exists from here on (zeros change nothing), so that folding has
/// somewhere to put what it moves.
fn add_zero_biases(params: &mut HashMap<String, P>, cfg: &mut TransformerConfig) {
    let mut zeros = |name: String, n: usize| {
        params.entry(name).or_insert_with(|| P { shape: vec![n], v: vec![0.0; n] });
    };
    for l in 0..cfg.n_layers() {
        let b = format!("blocks.{l}");
        zeros(format!("{b}.attn.qkv.bias"), cfg.qkv_width());
        zeros(format!("{b}.attn.out.bias"), cfg.d_model);
        if let Some(m) = cfg.d_mlp {
            zeros(format!("{b}.mlp.fc_in.bias"), m);
            zeros(format!("{b}.mlp.fc_out.bias"), cfg.d_model);
            if cfg.mlp == burnlens_model::MlpKind::Gated {
                zeros(format!("{b}.mlp.fc_gate.bias"), m);
            }
        }
    }
    if cfg.untied_unembed {
        zeros("unembed.bias".into(), cfg.vocab_size);
    }
    (cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias, cfg.unembed_bias) = (true, true, true, true);
}

/// Untie: W_U = W_Eᵀ, b_U = 0.
fn untie(params: &mut HashMap<String, P>, cfg: &mut TransformerConfig) {
    if cfg.untied_unembed {
        return;
    }
    let (d, vocab) = (cfg.d_model, cfg.vocab_size);
    let we = &params["embed.weight"];
    let mut wu = vec![0.0; d * vocab];
    for v in 0..vocab {
        for i in 0..d {
            wu[i * vocab + v] = we.v[v * d + i];
        }
    }
    params.insert("unembed.weight".into(), P { shape: vec![d, vocab], v: wu });
    params.insert("unembed.bias".into(), P { shape: vec![vocab], v: vec![0.0; vocab] });
    cfg.untied_unembed = true;
}

/// Each norm's gain and bias into the weights that read its output.
fn fold_layer_norms(params: &mut HashMap<String, P>, cfg: &TransformerConfig, layer_norm: bool) {
    let pair = |p: &str| (format!("{p}.weight"), format!("{p}.bias"));
    for l in 0..cfg.n_layers() {
        let b = format!("blocks.{l}");
        let mut mlp_readers = vec![pair(&format!("{b}.mlp.fc_in"))];
        if cfg.mlp == burnlens_model::MlpKind::Gated {
            mlp_readers.push(pair(&format!("{b}.mlp.fc_gate")));
        }
        let mut ln1_readers = vec![pair(&format!("{b}.attn.qkv"))];
        if cfg.shared_norm {
            // GPT-J: the MLP reads ln1's output too.
            ln1_readers.extend(mlp_readers.clone());
        }
        fold_into(params, &format!("{b}.ln1"), &ln1_readers, layer_norm);
        if cfg.has_ln2() {
            fold_into(params, &format!("{b}.ln2"), &mlp_readers, layer_norm);
        }
    }
    fold_into(params, "ln_final", &[pair("unembed")], layer_norm);
}

/// Every weight that writes to the residual stream, centred (LayerNorm removes the mean).
fn center_writing_weights(params: &mut HashMap<String, P>, cfg: &TransformerConfig) {
    center_rows(params.get_mut("embed.weight").expect("W_E"));
    if let Some(p) = params.get_mut("pos_embed.weight") {
        center_rows(p);
    }
    for l in 0..cfg.n_layers() {
        let b = format!("blocks.{l}");
        center_rows(params.get_mut(&format!("{b}.attn.out.weight")).expect("W_O"));
        center(&mut params.get_mut(&format!("{b}.attn.out.bias")).expect("b_O").v);
        if cfg.d_mlp.is_some() {
            center_rows(params.get_mut(&format!("{b}.mlp.fc_out.weight")).expect("W_out"));
            center(&mut params.get_mut(&format!("{b}.mlp.fc_out.bias")).expect("b_out").v);
        }
    }
}

/// The value bias through the output projection into `b_O` (the pattern sums to one).
fn fold_value_biases(params: &mut HashMap<String, P>, cfg: &TransformerConfig) {
    let (h, hk, dh, d) = (cfg.n_heads, cfg.kv_heads(), cfg.d_head, cfg.d_model);
    let hd = h * dh;
    for l in 0..cfg.n_layers() {
        let b = format!("blocks.{l}");
        let Some(qkv_b) = params.get_mut(&format!("{b}.attn.qkv.bias")) else { continue };
        let v0 = (h + hk) * dh;
        let b_v: Vec<f64> = qkv_b.v[v0..v0 + hk * dh].to_vec();
        qkv_b.v[v0..v0 + hk * dh].iter_mut().for_each(|x| *x = 0.0);
        let w_o = &params[&format!("{b}.attn.out.weight")];
        // Query head q reads value head q / (h / hk).
        let group = h / hk;
        let extra: Vec<f64> = (0..d).map(|j| (0..hd).map(|i| b_v[(i / dh / group) * dh + i % dh] * w_o.v[i * d + j]).sum()).collect();
        let b_o = params.get_mut(&format!("{b}.attn.out.bias")).expect("b_O");
        b_o.v.iter_mut().zip(extra).for_each(|(x, e)| *x += e);
    }
}
