//! Transcoder sets by Hub id, fetched the way circuit-tracer fetches them: `config.yaml`
//! first, then the files it lists (entries of `transcoders:` that are `hf://org/name/path`
//! URIs come from their own repositories, optionally `?revision=r`), or, without a list, the
//! repository's numbered layer files (`layer_{i}.safetensors`; a cross-layer transcoder's
//! `W_enc_{i}` / `W_dec_{i}`). Only those files are downloaded, into the Hugging Face cache
//! that `huggingface_hub` shares; `HF_HUB_OFFLINE=1` serves them from it.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use burnlens_hf::hub::{Hub, HubId, Progress, folder_spec, resolve_folder};

pub use crate::circuit_tracer::URI_SCHEME;
use crate::circuit_tracer::{CONFIG_FILE, is_cross_layer, numbered, numbered_prefixes, read_config};
use crate::{TraceError, TranscoderSet};

/// `hf://org/name/path/in/repo[?revision=r]` as the repository and the file's path in it.
pub fn parse_uri(uri: &str) -> Option<(HubId, String)> {
    let rest = uri.strip_prefix(URI_SCHEME)?;
    let (path, revision) = match rest.split_once('?') {
        Some((p, query)) => (p, query.split('&').find_map(|kv| kv.strip_prefix("revision="))),
        None => (rest, None),
    };
    let mut parts = path.splitn(3, '/');
    let (org, name, file) = (parts.next()?, parts.next()?, parts.next()?);
    let id = HubId::parse(&format!("{org}/{name}@{}", revision.unwrap_or("main")))?;
    (!file.is_empty() && !file.contains("..")).then(|| (id, file.to_string()))
}

/// Download the file an `hf://` URI names; its local path.
pub fn fetch_uri(uri: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf, TraceError> {
    let (id, file) = parse_uri(uri).ok_or_else(|| TraceError::Input(format!("`{uri}` is not a Hub file URI (hf://org/name/path[?revision=r])")))?;
    Ok(Hub::from_env().fetch_files(&id, std::slice::from_ref(&file), progress)?.join(file))
}

impl TranscoderSet {
    /// Load a circuit-tracer transcoder folder (`config.yaml` and its layer files); entries of
    /// its `transcoders:` list that are `hf://` URIs are fetched from the Hub.
    pub fn load(dir: &Path, device: &Device) -> Result<Self, TraceError> {
        Self::load_with(dir, device, &mut |uri| fetch_uri(uri, &mut |_| {}))
    }

    /// A transcoder set from a local folder, or from the Hub by `org/name[@revision][:folder]`.
    pub fn open(spec: &str, device: &Device, progress: &mut dyn FnMut(Progress)) -> Result<Self, TraceError> {
        // A path (existing, or one that cannot be a Hub id) is a local folder, whose missing
        // config.yaml is then the error.
        if Path::new(spec).exists() || folder_spec(spec).is_none() {
            return Self::load_with(Path::new(spec), device, &mut |uri| fetch_uri(uri, progress));
        }
        let dir = resolve_folder(spec, &[CONFIG_FILE], progress)?;
        let (config_path, cfg) = read_config(&dir)?;
        let files: Vec<String> = match cfg.lists.get("transcoders") {
            Some(list) => list.iter().filter(|p| !p.starts_with(URI_SCHEME)).cloned().collect(),
            None => {
                let (id, folder) = folder_spec(spec).expect("resolve_folder accepted it");
                let prefixes = numbered_prefixes(is_cross_layer(&cfg, &config_path)?);
                let under = if folder.is_empty() { String::new() } else { format!("{folder}/") };
                let listing = Hub::from_env().list_files(&id)?;
                let names: Vec<String> = listing
                    .iter()
                    .filter_map(|f| f.strip_prefix(&under))
                    .filter(|f| prefixes.iter().any(|p| numbered(f, p).is_some()))
                    .map(String::from)
                    .collect();
                if names.is_empty() {
                    return Err(TraceError::Input(format!(
                        "{spec}: config.yaml lists no transcoders and the repository has no {}{{i}}.safetensors files",
                        prefixes[0]
                    )));
                }
                names
            }
        };
        let names: Vec<&str> = files.iter().map(String::as_str).collect();
        let dir = resolve_folder(spec, &names, progress)?;
        Self::load_with(&dir, device, &mut |uri| fetch_uri(uri, progress))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_uris_parse_as_circuit_tracer_writes_them() {
        let (id, file) = parse_uri("hf://google/gemma-scope-2b-pt-transcoders/layer_0/width_16k/average_l0_76/params.npz").unwrap();
        assert_eq!(
            (id.repo.as_str(), id.revision.as_str(), file.as_str()),
            ("google/gemma-scope-2b-pt-transcoders", "main", "layer_0/width_16k/average_l0_76/params.npz")
        );
        let (id, file) = parse_uri("hf://org/tc/layer_3.safetensors?revision=v2").unwrap();
        assert_eq!((id.revision.as_str(), file.as_str()), ("v2", "layer_3.safetensors"));
        for bad in ["org/tc/layer_0.safetensors", "hf://org/tc", "hf://org/tc/", "hf://org/tc/../x", "hf://o rg/tc/f"] {
            assert!(parse_uri(bad).is_none(), "{bad}");
        }
    }
}
