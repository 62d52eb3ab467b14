//! Training a sparse autoencoder on activations streamed from a model: each step runs the
//! model (no gradients) on a fresh batch of token sequences, reads the hook point, and takes
//! one Adam step of the SAE on those activations. Nothing but the current batch is held.
//!
//! Losses as in SAELens: standard SAEs minimise `‖x − x̂‖² + λ Σ_i f_i ‖W_dec[i]‖` (sum over
//! `d_in`, mean over tokens), TopK SAEs `‖x − x̂‖²` alone. The result is an ordinary [`Sae`]
//! (save it with [`Sae::save`] in SAELens's layout).

use burn::module::{Module, Param};
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Distribution, Tensor};
use burnlens_model::{Hooks, Rng, Transformer};
use serde::Serialize;

use crate::sae::{Architecture, Normalize, Sae, SaeConfig, SaeError};

/// Where the training tokens come from.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// Uniformly random tokens.
    Random { vocab: usize },
    /// A random sequence of half the length, repeated (the induction toy's data).
    Repeated { vocab: usize },
    /// Random windows of a token stream (a tokenized text).
    Text(Vec<i64>),
}

impl TokenSource {
    fn batch(&self, rng: &mut Rng, batch: usize, len: usize) -> Vec<Vec<i64>> {
        (0..batch)
            .map(|_| match self {
                TokenSource::Random { vocab } => (0..len).map(|_| rng.below(*vocab as u64) as i64).collect(),
                TokenSource::Repeated { vocab } => {
                    let half = len.div_ceil(2);
                    let r: Vec<i64> = (0..half).map(|_| rng.below(*vocab as u64) as i64).collect();
                    r.iter().chain(&r).take(len).copied().collect()
                }
                TokenSource::Text(ids) => {
                    let start = rng.below((ids.len() - len + 1) as u64) as usize;
                    ids[start..start + len].to_vec()
                }
            })
            .collect()
    }
}

/// What to train.
#[derive(Debug, Clone, Serialize)]
pub struct SaeTrainConfig {
    pub hook_name: String,
    pub d_sae: usize,
    /// `Standard` (with `l1_coefficient`) or `TopK { k, .. }`.
    pub architecture: Architecture,
    pub l1_coefficient: f64,
    pub learning_rate: f64,
    pub steps: usize,
    /// Sequences per step, and their length: `batch · seq_len` activations per step.
    pub batch: usize,
    pub seq_len: usize,
    pub seed: u64,
}

/// How training went, measured on batches the SAE was not trained on.
#[derive(Debug, Clone, Serialize)]
pub struct SaeTrainReport {
    pub config: SaeTrainConfig,
    /// `(step, loss, mse, mean L0)` every `steps / 20` steps, on the training batch.
    pub curve: Vec<(usize, f64, f64, f64)>,
    /// On fresh held-out batches after training.
    pub explained_variance: f64,
    pub mean_l0: f64,
    pub mse: f64,
    pub dead_features: usize,
    /// Activations seen in total.
    pub tokens: usize,
}

#[derive(Module, Debug)]
struct Params {
    w_enc: Param<Tensor<2>>,
    b_enc: Param<Tensor<1>>,
    w_dec: Param<Tensor<2>>,
    b_dec: Param<Tensor<1>>,
}

impl Params {
    /// `(features, reconstruction)` of `x: [n, d_in]`.
    fn forward(&self, x: Tensor<2>, arch: Architecture) -> (Tensor<2>, Tensor<2>) {
        let d = self.b_dec.dims()[0];
        let m = self.b_enc.dims()[0];
        let pre = (x - self.b_dec.val().reshape([1, d])).matmul(self.w_enc.val()) + self.b_enc.val().reshape([1, m]);
        let f = match arch {
            Architecture::TopK { k, .. } => {
                let kth = pre.clone().detach().topk(k, 1).narrow(1, k - 1, 1).expand(pre.dims());
                relu(pre.clone()) * pre.detach().greater_equal(kth).float()
            }
            _ => relu(pre),
        };
        let r = f.clone().matmul(self.w_dec.val()) + self.b_dec.val().reshape([1, d]);
        (f, r)
    }
}

/// The model's activations at `hook` for `seqs`, flattened to `[tokens, d_in]`, on the
/// model's (non-autodiff) device.
fn activations(model: &Transformer, hook: &str, seqs: &[Vec<i64>], cfg: &SaeConfig) -> Result<Tensor<2>, SaeError> {
    let (b, t) = (seqs.len(), seqs[0].len());
    let flat: Vec<i64> = seqs.iter().flatten().copied().collect();
    let ids = Tensor::from_data(burn::tensor::TensorData::new(flat, [b, t]), &model.device());
    let mut hooks = Hooks::capture(|n| n == hook);
    model.forward_hooked(ids, &mut hooks);
    let act = hooks.take_cache().remove(hook).expect("hook captured");
    cfg.flatten(&act)
}

/// Train an SAE on `model`'s activations at `cfg.hook_name`, drawing tokens from `source`.
pub fn train_sae(model: &Transformer, source: &TokenSource, cfg: &SaeTrainConfig) -> Result<(Sae, SaeTrainReport), SaeError> {
    check_inputs(model, source, cfg)?;
    let device: Device = model.device();
    let ad = device.clone().autodiff();
    let mut rng = Rng::new(cfg.seed);
    let sae_cfg = probe_config(model, source, cfg, &mut rng)?;
    let d_in = sae_cfg.d_in;

    // Initialisation (as SAELens): decoder rows random with norm 0.1, encoder its transpose,
    // b_dec the mean of the first batch.
    let first = activations(model, &cfg.hook_name, &source.batch(&mut rng, cfg.batch, cfg.seq_len), &sae_cfg)?;
    let w_dec = Tensor::<2>::random([cfg.d_sae, d_in], Distribution::Normal(0.0, 1.0), &device);
    let w_dec = w_dec.clone() / w_dec.square().sum_dim(1).sqrt() * 0.1;
    // Trainable leaves on the autodiff twin of the model's device.
    let leaf2 = |t: Tensor<2>| Param::from_tensor(Tensor::<2>::from_data(t.into_data(), &ad).autodiff().require_grad());
    let leaf1 = |t: Tensor<1>| Param::from_tensor(Tensor::<1>::from_data(t.into_data(), &ad).autodiff().require_grad());
    let mut params = Params {
        w_enc: leaf2(w_dec.clone().transpose()),
        b_enc: leaf1(Tensor::zeros([cfg.d_sae], &device)),
        w_dec: leaf2(w_dec),
        b_dec: leaf1(first.mean_dim(0).reshape([d_in])),
    };
    let mut optim = ModuleOptimizer::from(AdamConfig::new().with_beta_1(0.9).with_beta_2(0.999).build());
    let mut curve = Vec::new();
    let every = (cfg.steps / 20).max(1);
    let mut tokens = 0;
    for step in 0..cfg.steps {
        let x = activations(model, &cfg.hook_name, &source.batch(&mut rng, cfg.batch, cfg.seq_len), &sae_cfg)?;
        let n = x.dims()[0];
        tokens += n;
        let x = Tensor::<2>::from_data(x.into_data(), &ad).autodiff();
        let (f, r) = params.forward(x.clone(), cfg.architecture);
        let mse = (r - x).square().sum_dim(1).mean();
        let loss = match cfg.architecture {
            Architecture::TopK { .. } => mse.clone(),
            _ => {
                let norms = params.w_dec.val().square().sum_dim(1).sqrt().reshape([1, cfg.d_sae]);
                mse.clone() + (f.clone() * norms).sum_dim(1).mean() * cfg.l1_coefficient
            }
        };
        if step % every == 0 || step + 1 == cfg.steps {
            let l0 = f.clone().inner().greater_elem(0.0).float().sum_dim(1).mean().into_scalar::<f32>() as f64;
            curve.push((step, loss.clone().inner().into_scalar::<f32>() as f64, mse.clone().inner().into_scalar::<f32>() as f64, l0));
        }
        // Linear warm-down over the last fifth, as SAELens's default schedule ends.
        let tail = cfg.steps / 5;
        let lr = if tail > 0 && step >= cfg.steps - tail { cfg.learning_rate * (cfg.steps - step) as f64 / tail as f64 } else { cfg.learning_rate };
        let grads = GradientsParams::from_grads(loss.backward(), &params);
        params = optim.step(lr, params, grads);
    }
    let sae = Sae {
        cfg: sae_cfg,
        w_enc: params.w_enc.val().inner(),
        b_enc: params.b_enc.val().inner(),
        w_dec: params.w_dec.val().inner(),
        b_dec: params.b_dec.val().inner(),
        threshold: None,
    };
    let eval = evaluate(model, source, cfg, &sae)?;
    let report = SaeTrainReport {
        config: cfg.clone(),
        curve,
        explained_variance: eval.explained_variance,
        mean_l0: eval.mean_l0,
        mse: eval.mse,
        dead_features: eval.dead_features,
        tokens,
    };
    Ok((sae, report))
}

/// The SAE's config, its width probed with a one-sequence run at the hook point.
fn probe_config(model: &Transformer, source: &TokenSource, cfg: &SaeTrainConfig, rng: &mut Rng) -> Result<SaeConfig, SaeError> {
    let hook_err = |msg: String| SaeError::Hook { hook: cfg.hook_name.clone(), msg };
    let probe_seq = source.batch(rng, 1, cfg.seq_len);
    let mut hooks = Hooks::capture(|n| n == cfg.hook_name);
    model.forward_hooked(model.ids_tensor(&probe_seq[0]), &mut hooks);
    let act = hooks.take_cache().remove(&cfg.hook_name).expect("hook captured");
    let dims = act.dims();
    let (d_in, hook_z) = match dims.len() {
        3 => (dims[2], false),
        _ if crate::sae::is_hook_z(&cfg.hook_name) => (dims[2] * dims[3], true),
        _ => return Err(hook_err(format!("activation of shape {dims:?}: only [batch, pos, d] points and hook_z can be used"))),
    };
    Ok(SaeConfig {
        d_in,
        d_sae: cfg.d_sae,
        architecture: cfg.architecture,
        apply_b_dec_to_input: true,
        normalize_activations: Normalize::None,
        hook_name: cfg.hook_name.clone(),
        reshape_hook_z: hook_z,
        model_name: None,
    })
}

/// The hook point exists, the sizes are usable and the text is long enough.
fn check_inputs(model: &Transformer, source: &TokenSource, cfg: &SaeTrainConfig) -> Result<(), SaeError> {
    let hook_err = |msg: String| SaeError::Hook { hook: cfg.hook_name.clone(), msg };
    if !Architecture::TRAINABLE.contains(&cfg.architecture.name()) {
        return Err(SaeError::Unsupported(format!("training a {} SAE (expected {})", cfg.architecture.name(), Architecture::TRAINABLE.join(" or "))));
    }
    if !burnlens_model::hook_names(&model.config).contains(&cfg.hook_name) {
        return Err(hook_err("the model has no hook point of that name".into()));
    }
    if cfg.seq_len < 2 || cfg.seq_len > model.config.n_ctx || cfg.batch == 0 || cfg.steps == 0 || cfg.d_sae == 0 {
        return Err(hook_err(format!("need 2 <= seq_len <= {} and batch, steps, d_sae > 0", model.config.n_ctx)));
    }
    if let TokenSource::Text(ids) = source
        && ids.len() < cfg.seq_len
    {
        return Err(hook_err(format!("the text has {} tokens, fewer than seq_len {}", ids.len(), cfg.seq_len)));
    }
    Ok(())
}

/// What a trained SAE does on held-out batches.
struct Evaluation {
    explained_variance: f64,
    mean_l0: f64,
    mse: f64,
    dead_features: usize,
}

/// Four held-out batches (their own seed) through `sae`.
fn evaluate(model: &Transformer, source: &TokenSource, cfg: &SaeTrainConfig, sae: &Sae) -> Result<Evaluation, SaeError> {
    let mut eval_rng = Rng::new(cfg.seed ^ 0x5eed_e7a1);
    let (mut err, mut tot, mut l0, mut n_all) = (0.0, 0.0, 0.0, 0usize);
    let mut fired = vec![false; cfg.d_sae];
    for _ in 0..4 {
        let x = activations(model, &cfg.hook_name, &source.batch(&mut eval_rng, cfg.batch, cfg.seq_len), &sae.cfg)?;
        let n = x.dims()[0];
        let (f, r) = sae.forward(x.clone());
        err += (x.clone() - r).square().sum().into_scalar::<f32>() as f64;
        tot += (x.clone() - x.mean_dim(0)).square().sum().into_scalar::<f32>() as f64;
        let fv: Vec<f32> = f.into_data().try_into_vec_as::<f32>().expect("f32");
        for row in fv.chunks(cfg.d_sae) {
            for (i, &a) in row.iter().enumerate() {
                if a > 0.0 {
                    l0 += 1.0;
                    fired[i] = true;
                }
            }
        }
        n_all += n;
    }
    Ok(Evaluation { explained_variance: 1.0 - err / tot, mean_l0: l0 / n_all as f64, mse: err / n_all as f64, dead_features: fired.iter().filter(|&&b| !b).count() })
}
