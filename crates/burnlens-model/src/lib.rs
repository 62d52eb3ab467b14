//! The canonical decoder-only transformer of burnlens, its configuration and hook points.
//!
//! Everything here is backend-free: a model lives on whatever [`burn::tensor::Device`] it was
//! built or loaded on.

pub mod attention;
pub mod backend;
pub mod block;
pub mod checkpoints;
pub mod config;
pub mod error;
pub mod files;
pub mod generate;
pub mod gpu;
pub mod hook_point;
pub mod hooks;
pub mod kernels;
pub mod kv_cache;
pub mod loss;
pub mod matmul;
pub mod mlp;
pub mod norm;
pub mod read_back;
pub mod rng;
pub mod rotary;
pub mod size;
pub mod stop;
pub mod transformer;
pub mod weights;

pub use config::{
    ActivationFn, AttentionSpan, MAX_LAYERS, MlpKind, NormKind, NormPlacement, Positional, QkNorm, RopeScaling, Rotary, ScoreScale, TransformerConfig,
};
pub use error::ModelError;
pub use generate::{Sampling, generate};
pub use hook_point::{AttnHook, BlockHook, HookPoint, LayerHook, MlpHook, NormHook, NormSite, act_name, hook_names, hook_points};
pub use hooks::{Activation, Hookable, Hooks, named};
pub use rng::Rng;
pub use size::ParamShape;
pub use transformer::{
    Attention, AttentionInput, Block, Forward, KvCache, LayerInput, MASKED_SCORE, Mlp, Norm, ParamInit, RotaryAngles, Stop, Transformer, Unembed, activate,
    apply_rotary, cross_entropy, f32_val, next_token_loss, next_token_loss_of_real,
};
