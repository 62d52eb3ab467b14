//! Looking inside burnlens models, with TransformerLens's vocabulary: activation caches and
//! interventions, per-head QK/OV circuits as factored matrices, composition scores, weight
//! processing, head detectors, the induction experiment, and HTML/SVG reports.

pub mod cache;
pub mod circuits;
pub mod composition;
pub mod detect;
pub mod dictionary;
pub mod factored;
pub mod grad;
pub mod head_weights;
pub mod hook_pass;
pub mod names;
pub mod patching;
pub mod process;
pub mod report;
pub mod residual;
pub mod sae;
pub mod tl_config;
pub mod tool_reports;
pub mod views;

pub use cache::{Ablation, ActivationCache, ablate_heads, patch, run_with_cache};
pub use composition::{CompositionScores, composition_scores};
pub use detect::{Detector, InductionCircuit, InductionReport, head_scores, induction_circuit, induction_experiment};
pub use dictionary::{Dictionary, Rule};
pub use factored::{FactoredMatrix, Svd, copying_score};
pub use grad::{HookGradients, Metric, MetricError, MetricParseError, hook_gradients};
pub use head_weights::{HeadWeights, head_weights};
pub use names::HookSelection;
pub use patching::{Node, NodeKind, PatchingResult, activation_patching, attribution_patching, compare_patching};
pub use process::{ProcessOptions, process_weights};
pub use residual::{
    Components, LogitAttribution, LogitLens, accumulated_points, decompose_resid, direct_logit_attribution, logit_lens, residual_components, stack_head_results,
};
pub use sae::{Sae, SaeConfig, SaeError, SaeRun, gemma_scope, run_sae};
pub use tl_config::TlConfig;
