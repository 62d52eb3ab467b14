//! The SAE itself: its config (as SAELens 6 writes it, older configs upgraded the way SAELens
//! does), its weights, encoding and decoding, and running it on a model. The bottom of
//! [`crate::sae`]: the readers of each file format build these types.
//!
//! The computation follows SAELens 6: `encode(x) = dict.encode(norm_in(x))` and
//! `decode(f) = norm_out(dict.decode(f))`, where the dictionary ([`crate::dictionary`])
//! holds the weights and the activation rule (ReLU for SAELens's "standard", JumpReLU, TopK).

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use burnlens_model::{Activation, AttnHook, HookPoint, Hooks, Transformer, next_token_loss};
use serde::Serialize;
use serde_json::Value;

use crate::dictionary::{Dictionary, Rule};

/// Whether `hook_name` is a head-resolved `hook_z` (`[batch, pos, head, d_head]`), which an
/// SAE reads flattened to `[batch, pos, head * d_head]`.
pub fn is_hook_z(hook_name: &str) -> bool {
    matches!(HookPoint::parse(hook_name), Some(HookPoint::Attn(_, AttnHook::Z)))
}

/// A problem with an SAE directory or with using it on a model.
#[derive(Debug, thiserror::Error)]
pub enum SaeError {
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error("{path}: field `{field}`: {msg}")]
    Field { path: PathBuf, field: String, msg: String },
    #[error("{path}: tensor `{name}`: {msg}")]
    Tensor { path: PathBuf, name: String, msg: String },
    #[error("SAE hook point `{hook}`: {msg}")]
    Hook { hook: String, msg: String },
    #[error("SAE: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Pass(#[from] crate::hook_pass::PassError),
}

/// Run-time normalisation of the SAE's input (and the inverse on its output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalize {
    None,
    /// A scaling factor that SAELens folds into the weights when it knows one; from disk
    /// it is the identity, as in SAELens.
    ExpectedAverageOnlyIn,
    /// Scale each input to norm `sqrt(d_in)`.
    ConstantNormRescale,
    /// Subtract each input's mean, divide by its (unbiased) standard deviation + 1e-5.
    LayerNorm,
}

/// What `cfg.json` says, as burnlens uses it.
#[derive(Debug, Clone, Serialize)]
pub struct SaeConfig {
    pub d_in: usize,
    pub d_sae: usize,
    pub architecture: Rule,
    pub apply_b_dec_to_input: bool,
    pub normalize_activations: Normalize,
    /// The TransformerLens hook name the SAE reads.
    pub hook_name: String,
    /// `hook_z` SAEs read `[.., head, d_head]` flattened to `head·d_head`.
    pub reshape_hook_z: bool,
    pub model_name: Option<String>,
}

/// A sparse autoencoder on one hook point: SAELens's config around a [`Dictionary`] (whose
/// rule is the config's `architecture`, set by [`Sae::new`]).
#[derive(Debug, Clone)]
pub struct Sae {
    pub cfg: SaeConfig,
    pub dict: Dictionary,
}

fn field_err(path: &Path, field: &str, msg: impl Into<String>) -> SaeError {
    SaeError::Field { path: path.to_path_buf(), field: field.into(), msg: msg.into() }
}

impl SaeConfig {
    /// Flatten an activation at the SAE's hook to `[batch·pos, d_in]`, checking its width.
    pub fn flatten(&self, act: &Activation) -> Result<Tensor<2>, SaeError> {
        let dims = act.dims();
        let d_in = self.d_in;
        let (rows, width, t) = match act {
            Activation::Rank3(t) => (dims[0] * dims[1], dims[2], Activation::Rank3(t.clone())),
            Activation::Rank4(t) if self.reshape_hook_z => (dims[0] * dims[1], dims[2] * dims[3], Activation::Rank4(t.clone())),
            Activation::Rank4(_) => {
                return Err(SaeError::Hook {
                    hook: self.hook_name.clone(),
                    msg: format!("activation of shape {dims:?} is not [batch, pos, d]; only hook_z SAEs read per-head activations"),
                });
            }
        };
        if width != d_in {
            return Err(SaeError::Hook {
                hook: self.hook_name.clone(),
                msg: format!("the model's activation has width {width} (shape {dims:?}), the SAE's d_in is {d_in}"),
            });
        }
        Ok(match t {
            Activation::Rank3(t) => t.reshape([rows, width]),
            Activation::Rank4(t) => t.reshape([rows, width]),
        })
    }

    /// Parse a `cfg.json` (SAELens 6, or older: upgraded as SAELens does).
    pub fn parse(text: &str, path: &Path) -> Result<Self, SaeError> {
        let v: Value = serde_json::from_str(text).map_err(|e| SaeError::File { path: path.into(), msg: format!("not valid JSON: {e}") })?;
        let obj = v.as_object().ok_or_else(|| SaeError::File { path: path.into(), msg: "expected a JSON object".into() })?;
        let meta = obj.get("metadata").and_then(Value::as_object);
        // SAELens 6 keeps the hook under `metadata`; older releases at the top level, as
        // `hook_name` or `hook_point`.
        let lookup = |k: &str| obj.get(k).filter(|v| !v.is_null()).or_else(|| meta.and_then(|m| m.get(k)).filter(|v| !v.is_null()));
        let usize_field = |k: &str| -> Result<usize, SaeError> {
            lookup(k)
                .ok_or_else(|| field_err(path, k, "missing (expected a positive integer)"))?
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| field_err(path, k, "expected a positive integer"))
        };
        let d_in = usize_field("d_in")?;
        let d_sae = usize_field("d_sae")?;
        let hook_name = ["hook_name", "hook_point"]
            .iter()
            .find_map(|k| lookup(k).and_then(Value::as_str))
            .ok_or_else(|| field_err(path, "hook_name", "missing: expected the hook point at the top level or under `metadata`"))?
            .to_string();
        let activation_fn = lookup("activation_fn").or_else(|| lookup("activation_fn_str")).and_then(Value::as_str).unwrap_or("relu");
        let mut arch = lookup("architecture").and_then(Value::as_str).unwrap_or("standard").to_string();
        let k_old = lookup("activation_fn_kwargs").and_then(|k| k.get("k")).and_then(Value::as_u64);
        if activation_fn == "topk" && k_old.is_some() {
            arch = "topk".into();
        }
        let k = lookup("k").and_then(Value::as_u64).or(k_old).map(|k| k as usize);
        let rescale = lookup("rescale_acts_by_decoder_norm").and_then(Value::as_bool).unwrap_or(false);
        let architecture = Rule::from_name(&arch, k, rescale, d_sae).map_err(|(field, msg)| field_err(path, field, msg))?;
        let normalize_activations = match lookup("normalize_activations") {
            None | Some(Value::Bool(false)) => Normalize::None,
            Some(Value::Bool(true)) => Normalize::ExpectedAverageOnlyIn,
            Some(Value::String(s)) => match s.as_str() {
                "none" => Normalize::None,
                "expected_average_only_in" => Normalize::ExpectedAverageOnlyIn,
                "constant_norm_rescale" => Normalize::ConstantNormRescale,
                "layer_norm" => Normalize::LayerNorm,
                other => {
                    return Err(field_err(
                        path,
                        "normalize_activations",
                        format!("\"{other}\" is not supported (expected none, expected_average_only_in, constant_norm_rescale or layer_norm)"),
                    ));
                }
            },
            Some(other) => return Err(field_err(path, "normalize_activations", format!("expected a string, found {other}"))),
        };
        let reshape_hook_z = match lookup("reshape_activations").and_then(Value::as_str) {
            Some("hook_z") => true,
            Some(_) => false,
            None => is_hook_z(&hook_name),
        };
        Ok(SaeConfig {
            d_in,
            d_sae,
            architecture,
            apply_b_dec_to_input: lookup("apply_b_dec_to_input").and_then(Value::as_bool).unwrap_or(true),
            normalize_activations,
            hook_name,
            reshape_hook_z,
            model_name: lookup("model_name").and_then(Value::as_str).map(str::to_string),
        })
    }

    /// `cfg.json` in SAELens 6's layout.
    pub fn to_json(&self) -> Value {
        let arch = self.architecture.name();
        let (k, rescale) = match self.architecture {
            Rule::TopK { k, rescale_acts_by_decoder_norm, .. } => (Some(k), Some(rescale_acts_by_decoder_norm)),
            _ => (None, None),
        };
        let norm = match self.normalize_activations {
            Normalize::None => "none",
            Normalize::ExpectedAverageOnlyIn => "expected_average_only_in",
            Normalize::ConstantNormRescale => "constant_norm_rescale",
            Normalize::LayerNorm => "layer_norm",
        };
        let mut v = serde_json::json!({
            "architecture": arch,
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": "float32",
            "device": "cpu",
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
            "normalize_activations": norm,
            "reshape_activations": if self.reshape_hook_z { "hook_z" } else { "none" },
            "metadata": {
                "sae_lens_version": "6.0.0",
                "sae_lens_training_version": "6.0.0",
                "hook_name": self.hook_name,
                "model_name": self.model_name,
                "trained_with": "burnlens",
            },
        });
        if let Some(k) = k {
            v["k"] = k.into();
            v["rescale_acts_by_decoder_norm"] = rescale.unwrap_or(false).into();
        }
        v
    }
}

/// The SAE's input, normalised, and what undoes the normalisation on the output.
struct NormState {
    /// `[n, 1]` multiplier (constant norm) or standard deviation (layer norm).
    scale: Option<Tensor<2>>,
    /// `[n, 1]` mean (layer norm).
    mean: Option<Tensor<2>>,
}
impl Sae {
    /// The SAE of `cfg` with weights `dict` (its rule and input offset taken from `cfg`).
    pub fn new(cfg: SaeConfig, mut dict: Dictionary) -> Sae {
        dict.rule = cfg.architecture;
        dict.subtract_b_dec = cfg.apply_b_dec_to_input;
        Sae { cfg, dict }
    }

    /// This SAE with the weights `dict` (folded, restricted, ...): its config follows the
    /// dictionary (rule, input offset, widths), so the two never disagree.
    pub fn with_dict(&self, dict: Dictionary) -> Sae {
        let mut cfg = self.cfg.clone();
        cfg.architecture = dict.rule;
        cfg.apply_b_dec_to_input = dict.subtract_b_dec;
        (cfg.d_in, cfg.d_sae) = (dict.d_in(), dict.d_sae());
        Sae { cfg, dict }
    }

    fn norm_in(&self, x: Tensor<2>) -> (Tensor<2>, NormState) {
        match self.cfg.normalize_activations {
            Normalize::None | Normalize::ExpectedAverageOnlyIn => (x, NormState { scale: None, mean: None }),
            Normalize::ConstantNormRescale => {
                let coeff = x.clone().square().sum_dim(1).sqrt().recip() * (self.cfg.d_in as f64).sqrt();
                (x * coeff.clone(), NormState { scale: Some(coeff), mean: None })
            }
            Normalize::LayerNorm => {
                let d = self.cfg.d_in;
                let mean = x.clone().mean_dim(1);
                let centred = x - mean.clone();
                let std = (centred.clone().square().sum_dim(1) / (d as f64 - 1.0).max(1.0)).sqrt();
                (centred / (std.clone() + 1e-5), NormState { scale: Some(std), mean: Some(mean) })
            }
        }
    }

    fn norm_out(&self, y: Tensor<2>, s: &NormState) -> Tensor<2> {
        match self.cfg.normalize_activations {
            Normalize::None | Normalize::ExpectedAverageOnlyIn => y,
            Normalize::ConstantNormRescale => y / s.scale.clone().expect("scale"),
            Normalize::LayerNorm => y * s.scale.clone().expect("std") + s.mean.clone().expect("mean"),
        }
    }

    /// Feature activations `[n, d_sae]` of inputs `x: [n, d_in]`.
    pub fn encode(&self, x: Tensor<2>) -> Tensor<2> {
        self.encode_with(x).0
    }

    fn encode_with(&self, x: Tensor<2>) -> (Tensor<2>, NormState) {
        let (x, state) = self.norm_in(x);
        (self.dict.encode(x), state)
    }

    fn decode_with(&self, f: Tensor<2>, state: &NormState) -> Tensor<2> {
        self.norm_out(self.dict.decode(f), state)
    }

    /// Reconstruction `[n, d_in]` from feature activations `f: [n, d_sae]`, for SAEs whose
    /// output does not depend on their input's normalisation (`none`,
    /// `expected_average_only_in`); the others need the input ([`Sae::forward`]).
    pub fn decode(&self, f: Tensor<2>) -> Result<Tensor<2>, SaeError> {
        match self.cfg.normalize_activations {
            Normalize::None | Normalize::ExpectedAverageOnlyIn => Ok(self.decode_with(f, &NormState { scale: None, mean: None })),
            other => Err(SaeError::Unsupported(format!(
                "decoding features alone: this SAE's normalize_activations ({other:?}) rescales its output by its input's norm; use forward on the input"
            ))),
        }
    }

    /// Features and reconstruction of `x: [n, d_in]`: `([n, d_sae], [n, d_in])`.
    pub fn forward(&self, x: Tensor<2>) -> (Tensor<2>, Tensor<2>) {
        let (f, state) = self.encode_with(x);
        let r = self.decode_with(f.clone(), &state);
        (f, r)
    }

    /// Flatten an activation at the SAE's hook to `[batch·pos, d_in]`, checking its width.
    pub fn flatten(&self, act: &Activation) -> Result<Tensor<2>, SaeError> {
        self.cfg.flatten(act)
    }

    /// Check that `model` has the SAE's hook point.
    pub fn check_model(&self, model: &Transformer) -> Result<(), SaeError> {
        if !burnlens_model::hook_names(&model.config).contains(&self.cfg.hook_name) {
            return Err(SaeError::Hook { hook: self.cfg.hook_name.clone(), msg: "the model has no hook point of that name".into() });
        }
        Ok(())
    }

    /// The hook point the SAE reads (its `hook_name`, which [`check_model`](Self::check_model)
    /// has checked against the model's points).
    pub fn hook_point(&self) -> HookPoint {
        HookPoint::parse(&self.cfg.hook_name).unwrap_or_else(|| panic!("`{}` is not a hook point (check_model first)", self.cfg.hook_name))
    }
}

/// The SAE on one sequence: reconstruction quality, sparsity, the strongest features, and
/// what splicing the reconstruction into the forward pass costs.
#[derive(Debug, Clone, Serialize)]
pub struct SaeRun {
    pub hook_name: String,
    /// `[pos]` features active (> 0) at each position.
    pub l0: Vec<usize>,
    pub mean_l0: f64,
    /// Mean over positions of `|x − x̂|²`.
    pub mse: f64,
    /// `1 − Σ|x − x̂|² / Σ|x − mean(x)|²` over the positions of the sequence.
    pub explained_variance: f64,
    /// `[pos][k]` (feature, activation), strongest first.
    pub top_features: Vec<Vec<(usize, f64)>>,
    /// Next-token loss of the model as it is, with the SAE's reconstruction spliced in at the
    /// hook, and with the hook's activation set to zero.
    pub loss_clean: Option<f64>,
    pub loss_with_sae: Option<f64>,
    pub loss_zero_ablated: Option<f64>,
    /// `(zero − with_sae) / (zero − clean)`: 1 when the SAE loses nothing.
    pub loss_recovered: Option<f64>,
    /// `[pos]` how much the next-token loss at each position rises with the SAE spliced in
    /// (`None` at the last position).
    pub loss_increase: Vec<Option<f64>>,
    /// The feature with the largest activation on the sequence and its activation at every
    /// position (`None` if no feature fires).
    pub strongest_feature: Option<(usize, Vec<f64>)>,
}

/// The SAE's features `[pos, d_sae]` on one sequence, read at its hook point.
pub fn features(model: &Transformer, sae: &Sae, ids: &[i64]) -> Result<Tensor<2>, SaeError> {
    sae.check_model(model)?;
    let hook = sae.hook_point();
    let mut hooks = Hooks::capture(|p| p == hook);
    model.forward_hooked(model.ids_tensor(ids), &mut hooks);
    let act = hooks.take_cache().remove(&hook).expect("hook captured");
    Ok(sae.encode(sae.flatten(&act)?))
}

/// Replace the activation at the SAE's hook by its reconstruction.
pub fn splice<'a>(hooks: Hooks<'a>, sae: &'a Sae) -> Hooks<'a> {
    let hook = sae.hook_point();
    hooks.with_edit(
        move |p| p == hook,
        move |_, act| {
            let x = sae.flatten(&act).expect("checked before the run");
            let (_, r) = sae.forward(x);
            match act {
                Activation::Rank3(t) => Activation::Rank3(r.reshape(t.dims())),
                Activation::Rank4(t) => Activation::Rank4(r.reshape(t.dims())),
            }
        },
    )
}

/// Run `sae` on `ids` through `model`: metrics, the `k` strongest features per position and
/// the loss with the reconstruction spliced in.
pub fn run_sae(model: &Transformer, sae: &Sae, ids: &[i64], k: usize) -> Result<SaeRun, SaeError> {
    sae.check_model(model)?;
    let hook = sae.hook_point();
    let mut hooks = Hooks::capture(|p| p == hook);
    let input = model.ids_tensor(ids);
    let logits = model.forward_hooked(input.clone(), &mut hooks);
    let act = hooks.take_cache().remove(&hook).expect("hook captured");
    drop(hooks);
    let x = sae.flatten(&act)?;
    let [n, _] = x.dims();
    let (f, r) = sae.forward(x.clone());
    let fv: Vec<f32> = f.clone().into_data().try_into_vec_as::<f32>().expect("f32");
    let d_sae = sae.cfg.d_sae;
    let l0: Vec<usize> = fv.chunks(d_sae).map(|row| row.iter().filter(|&&a| a > 0.0).count()).collect();
    let err = (x.clone() - r).square().sum().into_scalar::<f32>() as f64;
    let total = (x.clone() - x.mean_dim(0)).square().sum().into_scalar::<f32>() as f64;
    let strongest_feature = (0..fv.len())
        .max_by(|&a, &b| fv[a].total_cmp(&fv[b]))
        .filter(|&i| fv[i] > 0.0)
        .map(|i| i % d_sae)
        .map(|f| (f, fv.chunks(d_sae).map(|row| row[f] as f64).collect()));
    let top_features = fv
        .chunks(d_sae)
        .map(|row| {
            let mut idx: Vec<usize> = (0..d_sae).filter(|&i| row[i] > 0.0).collect();
            idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            idx.truncate(k);
            idx.into_iter().map(|i| (i, row[i] as f64)).collect()
        })
        .collect();
    let with_logits = model.forward_hooked(input.clone(), &mut splice(Hooks::none(), sae));
    let (lp_clean, lp_with) = (crate::residual::next_token_logprobs(logits.clone(), ids), crate::residual::next_token_logprobs(with_logits.clone(), ids));
    let loss_increase = lp_clean.iter().zip(&lp_with).map(|(c, w)| Some(c.as_ref()? - w.as_ref()?)).collect();
    let (loss_clean, loss_with_sae, loss_zero_ablated) = if ids.len() >= 2 {
        let loss = |l: Tensor<3>| next_token_loss(l, input.clone()).into_scalar::<f32>() as f64;
        let clean = loss(logits);
        let with = loss(with_logits);
        let hook = sae.hook_point();
        let mut zero = Hooks::none().with_edit(
            move |p| p == hook,
            |_, a| match a {
                Activation::Rank3(t) => Activation::Rank3(t.zeros_like()),
                Activation::Rank4(t) => Activation::Rank4(t.zeros_like()),
            },
        );
        let zero = loss(model.forward_hooked(input.clone(), &mut zero));
        (Some(clean), Some(with), Some(zero))
    } else {
        (None, None, None)
    };
    let loss_recovered = match (loss_clean, loss_with_sae, loss_zero_ablated) {
        (Some(c), Some(s), Some(z)) if (z - c).abs() > 1e-12 => Some((z - s) / (z - c)),
        _ => None,
    };
    Ok(SaeRun {
        hook_name: sae.cfg.hook_name.clone(),
        mean_l0: l0.iter().sum::<usize>() as f64 / n as f64,
        l0,
        mse: err / n as f64,
        explained_variance: if total > 0.0 { 1.0 - err / total } else { f64::NAN },
        top_features,
        loss_clean,
        loss_with_sae,
        loss_zero_ablated,
        loss_recovered,
        loss_increase,
        strongest_feature,
    })
}

impl From<burnlens_model::files::FileError> for SaeError {
    fn from(e: burnlens_model::files::FileError) -> Self {
        SaeError::File { path: e.path, msg: e.source.to_string() }
    }
}
