//! The trainable SAE architectures as SAELens 6 defines them, with their settings, and the
//! loss terms each adds to the reconstruction error (named as SAELens names them in its
//! `losses` dictionary: the one source of those names).

use burnlens_lens::dictionary::Rule;
use serde::{Deserialize, Serialize};

/// TopK and BatchTopK settings (SAELens's `TopKTrainingSAEConfig` fields).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TopKSettings {
    /// Features kept per token (TopK), or on average per token across the batch (BatchTopK).
    pub k: f64,
    /// Weight of the auxiliary loss that has dead features reconstruct the residual.
    pub aux_loss_coefficient: f64,
    /// Choose the top k of the pre-activations times the decoder rows' norms.
    pub rescale_acts_by_decoder_norm: bool,
}

impl TopKSettings {
    /// SAELens's defaults for `k`.
    pub fn new(k: f64) -> Self {
        TopKSettings { k, aux_loss_coefficient: 1.0, rescale_acts_by_decoder_norm: true }
    }
}

/// JumpReLU settings (SAELens's `JumpReLUTrainingSAEConfig`, step sparsity loss).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct JumpReluSettings {
    pub init_threshold: f64,
    /// Width of the rectangle kernel of the straight-through estimator.
    pub bandwidth: f64,
    pub l0_coefficient: f64,
    pub l0_warm_up_steps: usize,
    /// Anthropic's pre-activation loss on dead features; `None` leaves it out.
    pub pre_act_loss_coefficient: Option<f64>,
}

impl Default for JumpReluSettings {
    fn default() -> Self {
        JumpReluSettings { init_threshold: 0.01, bandwidth: 0.05, l0_coefficient: 1.0, l0_warm_up_steps: 0, pre_act_loss_coefficient: None }
    }
}

/// A trainable architecture by SAELens's name (`--architecture`, Python's `architecture=`,
/// `cfg.json` while training): the one place these names are spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ArchitectureName {
    /// ReLU, L1 weighted by the decoder norms.
    Standard,
    Topk,
    Batchtopk,
    Jumprelu,
}

impl ArchitectureName {
    pub const ALL: [ArchitectureName; 4] = [ArchitectureName::Standard, ArchitectureName::Topk, ArchitectureName::Batchtopk, ArchitectureName::Jumprelu];

    /// SAELens's name.
    pub fn name(self) -> &'static str {
        match self {
            ArchitectureName::Standard => "standard",
            ArchitectureName::Topk => "topk",
            ArchitectureName::Batchtopk => "batchtopk",
            ArchitectureName::Jumprelu => "jumprelu",
        }
    }

    /// Whether it keeps `k` features (TopK and BatchTopK).
    pub fn keeps_k(self) -> bool {
        matches!(self, ArchitectureName::Topk | ArchitectureName::Batchtopk)
    }
}

impl std::fmt::Display for ArchitectureName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What switches features on and what sparsity costs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "architecture", rename_all = "snake_case")]
pub enum Architecture {
    /// ReLU; L1 of the activations weighted by the decoder rows' norms.
    Standard { l1_coefficient: f64, l1_warm_up_steps: usize },
    /// The k largest pre-activations per token (after ReLU).
    TopK(TopKSettings),
    /// The `k · tokens` largest activations of the whole batch; a threshold learnt on the
    /// side (an average of each batch's smallest kept activation) makes it a JumpReLU SAE
    /// for inference.
    BatchTopK { topk: TopKSettings, threshold_lr: f64 },
    /// `x · [x > θ]` with a trained threshold per feature; a step-function L0 loss.
    JumpRelu(JumpReluSettings),
}

/// A term of the training loss, by SAELens's name for it (which is also how it serialises).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LossTerm {
    Mse,
    L1,
    AuxiliaryReconstruction,
    L0,
    PreAct,
}

impl LossTerm {
    pub const ALL: [LossTerm; 5] = [LossTerm::Mse, LossTerm::L1, LossTerm::AuxiliaryReconstruction, LossTerm::L0, LossTerm::PreAct];

    /// The key of SAELens's `losses` dictionary.
    pub fn name(self) -> &'static str {
        match self {
            LossTerm::Mse => "mse_loss",
            LossTerm::L1 => "l1_loss",
            LossTerm::AuxiliaryReconstruction => "auxiliary_reconstruction_loss",
            LossTerm::L0 => "l0_loss",
            LossTerm::PreAct => "pre_act_loss",
        }
    }
}

impl Serialize for LossTerm {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl Architecture {
    /// Its name.
    pub fn kind(&self) -> ArchitectureName {
        match self {
            Architecture::Standard { .. } => ArchitectureName::Standard,
            Architecture::TopK(_) => ArchitectureName::Topk,
            Architecture::BatchTopK { .. } => ArchitectureName::Batchtopk,
            Architecture::JumpRelu(_) => ArchitectureName::Jumprelu,
        }
    }

    /// SAELens's name (`cfg.json`'s `architecture` while training).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The loss terms a step reports, in SAELens's order (sorted by name) without the total.
    pub fn loss_terms(&self) -> Vec<LossTerm> {
        let mut t = match self {
            Architecture::Standard { .. } => vec![LossTerm::Mse, LossTerm::L1],
            Architecture::TopK(_) | Architecture::BatchTopK { .. } => vec![LossTerm::Mse, LossTerm::AuxiliaryReconstruction],
            Architecture::JumpRelu(j) => {
                let mut t = vec![LossTerm::Mse, LossTerm::L0];
                t.extend(j.pre_act_loss_coefficient.map(|_| LossTerm::PreAct));
                t
            }
        };
        t.sort_by_key(|l| l.name());
        t
    }

    /// The sparsity coefficient and its linear warm-up, where the architecture has one.
    pub fn coefficient(&self) -> Option<(f64, usize)> {
        match self {
            Architecture::Standard { l1_coefficient, l1_warm_up_steps } => Some((*l1_coefficient, *l1_warm_up_steps)),
            Architecture::JumpRelu(j) => Some((j.l0_coefficient, j.l0_warm_up_steps)),
            _ => None,
        }
    }

    /// The TopK settings of TopK and BatchTopK SAEs.
    /// The rule a dictionary of this kind encodes with while it trains (BatchTopK's choice
    /// is made over the batch by the training pass; a trained one infers as JumpReLU).
    pub fn rule(&self) -> Rule {
        match self {
            Architecture::Standard { .. } => Rule::Relu,
            Architecture::JumpRelu(_) => Rule::JUMP_RELU,
            Architecture::TopK(t) | Architecture::BatchTopK { topk: t, .. } => Rule::top_k(t.k as usize, t.rescale_acts_by_decoder_norm),
        }
    }

    pub fn topk(&self) -> Option<&TopKSettings> {
        match self {
            Architecture::TopK(t) | Architecture::BatchTopK { topk: t, .. } => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_names_read_back_as_themselves() {
        for a in ArchitectureName::ALL {
            let back: ArchitectureName = serde_json::from_value(serde_json::Value::String(a.name().into())).unwrap();
            assert_eq!(back, a);
        }
    }

    #[test]
    fn loss_term_names_are_distinct_and_saelens_spelled() {
        let names: std::collections::BTreeSet<&str> = LossTerm::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names.len(), LossTerm::ALL.len());
        assert!(names.iter().all(|n| n.ends_with("_loss")));
    }
}
