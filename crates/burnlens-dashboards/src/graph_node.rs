//! What an attribution graph's feature node shows of its feature (`burnlens graph
//! --features`): a label for the viewer's `clerp` (the tokens it promotes most) and its
//! dashboard in brief (top examples with the token each is centred on, promoted and
//! suppressed tokens, maximum and density).

use serde_json::{Value, json};

use crate::config::DashboardConfig;
use crate::dashboard::FeatureDashboard;
use crate::html::centre;

/// Examples a node carries.
pub const NODE_EXAMPLES: usize = 5;

/// (`clerp`, dashboard) for a node.
pub fn node_fields(d: &FeatureDashboard, cfg: &DashboardConfig, tok: &dyn Fn(u32) -> String) -> (String, Value) {
    let promotes: Vec<String> = d.logits.top.iter().map(|r| tok(r.0)).collect();
    let suppresses: Vec<String> = d.logits.bottom.iter().map(|r| tok(r.0)).collect();
    let examples: Vec<Value> = d
        .top
        .iter()
        .take(NODE_EXAMPLES)
        .map(|e| json!({ "tokens": e.tokens.iter().map(|&t| tok(t)).collect::<Vec<_>>(), "acts": e.acts, "centre": centre(cfg.context, e.position) }))
        .collect();
    let label = format!("→ {}", promotes.iter().take(3).map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", "));
    (label, json!({ "max": d.max, "density": d.density, "examples": examples, "promotes": promotes, "suppresses": suppresses }))
}

/// The configuration a dashboards folder was made with (its `run.json`).
pub fn read_config(dir: &std::path::Path) -> Result<DashboardConfig, crate::DashboardError> {
    let path = dir.join("run.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| crate::DashboardError::Input(format!("{}: {e} (not a folder written by `burnlens dashboards`)", path.display())))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| crate::DashboardError::Input(format!("{}: {e}", path.display())))?;
    serde_json::from_value(v["config"].clone()).map_err(|e| crate::DashboardError::Input(format!("{}: field `config`: {e}", path.display())))
}
