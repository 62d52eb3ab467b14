//! Feature dashboards: for every feature of an SAE, what SAEDashboard (the maintained fork of
//! sae_vis) computes for Neuronpedia — the contexts where it fires most, samples across its
//! range, its activation histogram and density, the tokens it promotes and suppresses —
//! streamed over a corpus in two passes whose memory does not grow with the corpus.
//!
//! ```text
//! windows ─▶ FeatureSource (model ▸ hook ▸ SAE encoder) ─▶ ActBatch ─▶ Scan::first  (extremes, top groups)
//!                                                                   ─▶ Scan::second (histograms, quantile samples)
//! decoder rows ▸ resid direction ▸ W_U ─▶ LogitEffects ─────────────▶ FeatureDashboard
//! ```
//! One module per concept: [`config`], [`batch`] (activations and the example slots),
//! [`top`], [`reservoir`], [`histogram`], [`first_pass`], [`second_pass`], [`scan`],
//! [`logits`], [`dashboard`], [`source`], [`run`] with its [`checkpoint`], the user's
//! [`options`] and a whole [`job`]; [`spill`] keeps pass 1's inputs for pass 2; [`over_ranks`]
//! shares the passes among the ranks of an MPI job; the outputs [`neuronpedia`],
//! [`circuit_tracer`], [`html`], [`write`], and what a graph's node shows ([`graph_node`]).

pub mod batch;
pub mod checkpoint;
pub mod circuit_tracer;
pub mod config;
pub mod dashboard;
pub mod device_batch;
pub mod error;
pub mod first_pass;
pub mod graph_node;
pub mod histogram;
pub mod html;
pub mod job;
pub mod logits;
pub mod neuronpedia;
pub mod options;
pub mod over_ranks;
pub mod reservoir;
pub mod run;
pub mod scan;
pub mod second_pass;
pub mod source;
pub mod spill;
pub mod top;
pub mod write;

pub use config::{Context, DashboardConfig};
pub use dashboard::{Example, FeatureDashboard, FeatureKey, QuantileGroup};
pub use device_batch::ScanPlace;
pub use error::DashboardError;
pub use graph_node::{node_fields, read_config};
pub use histogram::Histogram;
pub use job::{Explained, Job, JobModel, Summary, make};
pub use logits::LogitEffects;
pub use options::DashboardOptions;
pub use run::{Outcome, Progress, Resume, RunSpec, run};
pub use source::{Encoder, FeatureSource};
pub use write::{RunInfo, read_feature, write_all};
