//! How a dictionary switches its features on: the activation rule applied to the
//! pre-activations, on the device or (for the selections) on the host's rows.

use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use serde::Serialize;

use super::select::kth_largest_rows;

/// The activation rule of a dictionary (an SAE, a transcoder, a CLT's layer).
///
/// SAELens and circuit-tracer differ in one place, kept as `relu`: SAELens applies a ReLU
/// after JumpReLU's mask and TopK's choice, circuit-tracer keeps the chosen values' signs.
/// (BatchTopK is a training rule: a trained BatchTopK dictionary infers as JumpReLU.)
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rule {
    /// `max(pre, 0)` (SAELens's "standard").
    Relu,
    /// `pre · [pre > θ]`, one threshold per feature (the dictionary's `threshold`).
    JumpRelu { relu: bool },
    /// Keep the `k` largest pre-activations of each row. With `rescale_acts_by_decoder_norm`
    /// the pre-activations are multiplied by the decoder rows' norms before the choice (and
    /// the activations divided by them before decoding).
    TopK { k: usize, rescale_acts_by_decoder_norm: bool, relu: bool },
}

impl Rule {
    /// SAELens's names, as `cfg.json` and the command line spell them.
    pub const NAMES: &'static [&'static str] = &["standard", "jumprelu", "topk"];

    /// SAELens's JumpReLU (ReLU after the mask).
    pub const JUMP_RELU: Rule = Rule::JumpRelu { relu: true };

    /// SAELens's TopK (ReLU after the choice).
    pub fn top_k(k: usize, rescale_acts_by_decoder_norm: bool) -> Rule {
        Rule::TopK { k, rescale_acts_by_decoder_norm, relu: true }
    }

    /// The SAELens name.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::Relu => "standard",
            Rule::JumpRelu { .. } => "jumprelu",
            Rule::TopK { .. } => "topk",
        }
    }

    /// The rule SAELens calls `name`; a topk dictionary keeps `k` features (1 to `d_sae`).
    /// The error names the field that is wrong (`architecture` or `k`) and why.
    pub fn from_name(name: &str, k: Option<usize>, rescale_acts_by_decoder_norm: bool, d_sae: usize) -> Result<Self, (&'static str, String)> {
        match name {
            "standard" => Ok(Rule::Relu),
            "jumprelu" => Ok(Rule::JUMP_RELU),
            "topk" => match k {
                None => Err(("k", "missing: a topk SAE needs k".into())),
                Some(k) if k == 0 || k > d_sae => Err(("k", format!("{k} is not between 1 and d_sae = {d_sae}"))),
                Some(k) => Ok(Rule::top_k(k, rescale_acts_by_decoder_norm)),
            },
            other => Err(("architecture", format!("\"{other}\" is not supported (expected {})", Self::NAMES.join(", ")))),
        }
    }

    /// Whether the activations are divided by the decoder rows' norms before decoding.
    pub fn rescales(&self) -> bool {
        matches!(self, Rule::TopK { rescale_acts_by_decoder_norm: true, .. })
    }

    /// The activations of pre-activations `pre: [n, d_sae]`; `threshold` is JumpReLU's,
    /// `norms` the decoder rows' norms (TopK with rescaling). On the host (burnlens's CPU
    /// kernels) the TopK choice is a selection per row; elsewhere the device's own `topk`.
    pub fn apply(&self, pre: Tensor<2>, threshold: Option<&Tensor<1>>, norms: impl FnOnce() -> Tensor<1>) -> Tensor<2> {
        let [n, m] = pre.dims();
        match *self {
            Rule::Relu => relu(pre),
            Rule::JumpRelu { relu: r } => {
                let th = threshold.expect("a JumpReLU dictionary has a threshold").clone().reshape([1, m]).expand([n, m]);
                let on = pre.clone().greater(th).float();
                if r { relu(pre) * on } else { pre * on }
            }
            Rule::TopK { k, rescale_acts_by_decoder_norm, relu: r } => {
                let scores = if rescale_acts_by_decoder_norm { pre * norms().reshape([1, m]) } else { pre };
                let kth = if burnlens_model::kernels::runs_on(&scores.device()) {
                    kth_largest_rows(&scores, k.min(m))
                } else {
                    scores.clone().topk(k.min(m), 1).narrow(1, k.min(m) - 1, 1)
                };
                // Everything at least as large as the k-th is kept (the k largest barring ties).
                let keep = scores.clone().greater_equal(kth.expand([n, m])).float();
                if r { relu(scores) * keep } else { scores * keep }
            }
        }
    }
}
