//! Sparse autoencoders: the SAE and its computation at the bottom ([`core`]), one reader per
//! file format beside it ([`saelens`]: SAELens's `cfg.json` and weights, also what burnlens
//! saves; [`gemma_scope`]: Gemma Scope's `params.npz` release folders), and on top the choice
//! of reader for a folder.

mod core;
pub mod gemma_scope;
pub mod saelens;

use std::path::Path;

use burn::tensor::Device;

pub use self::core::{Normalize, Sae, SaeConfig, SaeError, SaeRun, features, is_hook_z, run_sae, splice};
pub use saelens::{CFG_FILE, WEIGHTS_FILE};

/// The files of an SAE folder named by `spec` (`org/name[@rev]:folder` or a path): Gemma
/// Scope releases (a repository named `gemma-scope-...`) hold only `params.npz`, every other
/// release SAELens's `cfg.json` and weights. Only these are fetched from the Hub.
pub fn folder_files(spec: &str) -> &'static [&'static str] {
    let repo = spec.split_once(':').map_or(spec, |(r, _)| r);
    if repo.contains("gemma-scope") { &[gemma_scope::PARAMS_FILE] } else { &[CFG_FILE, WEIGHTS_FILE] }
}

impl Sae {
    /// Load an SAE folder: SAELens's layout (written by `SAE.save_model` or by burnlens), or
    /// Gemma Scope's release layout (a folder with only `params.npz`).
    pub fn load(dir: &Path, device: &Device) -> Result<Sae, SaeError> {
        if !dir.join(CFG_FILE).is_file() && dir.join(gemma_scope::PARAMS_FILE).is_file() {
            return gemma_scope::load(dir, device);
        }
        saelens::load(dir, device)
    }
}
