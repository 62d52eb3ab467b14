//! The offline browser: a folder that opens from disk with no network — `index.html` (every
//! feature's density, maximum and top tokens, a search by id) and `features/<id>.js`, each
//! feature's dashboard as a script the page loads when the feature is opened (scripts, not
//! JSON, because a page opened from `file://` may not fetch files).

use serde_json::{Value, json};

use crate::config::Context;
use crate::dashboard::FeatureDashboard;

const PAGE: &str = include_str!("../assets/browser.html");

/// A feature's data for the page: its dashboard with tokens as strings.
pub fn feature_script(d: &FeatureDashboard, tok: &dyn Fn(u32) -> String) -> String {
    let mut v = serde_json::to_value(d).expect("a dashboard serialises");
    let examples = |v: &mut Value| {
        for e in v.as_array_mut().unwrap() {
            let strs: Vec<String> = e["tokens"].as_array().unwrap().iter().map(|t| tok(t.as_u64().unwrap() as u32)).collect();
            e["tokens"] = json!(strs);
        }
    };
    examples(&mut v["top"]);
    for q in v["quantiles"].as_array_mut().unwrap() {
        examples(&mut q["examples"]);
    }
    for side in ["top", "bottom"] {
        for r in v["logits"][side].as_array_mut().unwrap() {
            r[0] = json!(tok(r[0].as_u64().unwrap() as u32));
        }
    }
    format!("burnlensFeature({});\n", script_safe(&v.to_string()))
}

/// JSON that cannot close the script element it sits in.
fn script_safe(s: &str) -> String {
    s.replace("</", "<\\/")
}

/// `index.html` for `dashboards` (`summary`: a line on what was read).
pub fn index_page(dashboards: &[FeatureDashboard], tok: &dyn Fn(u32) -> String, summary: &str, context: Context, positions: u64) -> String {
    let rows: Vec<Value> = dashboards
        .iter()
        .map(|d| {
            let tops: Vec<String> = d.top.iter().take(3).map(|e| tok(e.tokens[centre(context, e.position)])).collect();
            json!([d.key().stem(), d.density, d.max, tops.join(" | ")])
        })
        .collect();
    let (ctx, before) = match context {
        Context::Window => ("window", 0),
        Context::Around { before, .. } => ("around", before),
    };
    let meta = json!({ "summary": summary, "context": ctx, "before": before, "positions": positions });
    PAGE.replacen("/*INDEX*/null", &script_safe(&Value::from(rows).to_string()), 1).replacen("/*META*/null", &script_safe(&meta.to_string()), 1)
}

/// The index, among an example's shown tokens, of the token it is centred on.
pub fn centre(context: Context, position: usize) -> usize {
    match context {
        Context::Window => position - 1,
        Context::Around { before, .. } => before,
    }
}
