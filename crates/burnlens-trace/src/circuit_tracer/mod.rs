//! circuit-tracer's transcoder files, one module for the format: reading a per-layer set, a
//! Gemma Scope set or a cross-layer transcoder ([`read`]), and writing the first and the
//! last ([`write`]), each layer a lens [`Dictionary`](burnlens_lens::Dictionary).

pub mod read;
pub mod write;

pub use read::{CONFIG_FILE, FlatYaml, URI_SCHEME, is_cross_layer, numbered, numbered_prefixes, read_config, read_layer, read_npz_layer};
