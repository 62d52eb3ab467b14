//! Choosing hook points by name, the grammar every front end shares (the CLI's `--names`):
//! exact names separated by commas (`hook_embed,blocks.0.attn.hook_z`), or `re:REGEX`
//! matched against whole names (`re:blocks\.\d+\.attn\.hook_(q|k)`). Checked against the
//! model's own names ([`burnlens_model::hook_names`]), so a typo is an error, not an empty
//! cache.

/// What the examples in an error say names look like.
const EXAMPLES: &str = "names look like hook_embed, blocks.0.hook_resid_pre, blocks.0.attn.hook_pattern, blocks.0.mlp.hook_post";

/// A parsed selection of hook points.
#[derive(Debug, Clone)]
pub enum HookSelection {
    Names(Vec<String>),
    Regex(regex::Regex),
}

impl HookSelection {
    /// Parse `spec` against `all`, the model's hook names. The error is one line, naming the
    /// offending name or pattern and what names look like.
    pub fn parse(spec: &str, all: &[String]) -> Result<Self, String> {
        if let Some(re) = spec.strip_prefix("re:") {
            let anchored = regex::Regex::new(&format!("^(?:{re})$")).map_err(|e| format!("invalid regex: {e}"))?;
            if !all.iter().any(|n| anchored.is_match(n)) {
                return Err(format!("regex \"{re}\" matches no hook point of this model (it must match a whole name); {EXAMPLES}"));
            }
            return Ok(HookSelection::Regex(anchored));
        }
        let names: Vec<String> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        if names.is_empty() {
            return Err(format!("no hook name given; {EXAMPLES}"));
        }
        check_names(&names, all)?;
        Ok(HookSelection::Names(names))
    }

    /// Whether hook point `name` is selected.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            HookSelection::Names(names) => names.iter().any(|n| n == name),
            HookSelection::Regex(re) => re.is_match(name),
        }
    }
}

/// Every one of `names` is one of `all`, the model's hook names; else a one-line error
/// naming the first that is not.
pub fn check_names(names: &[String], all: &[String]) -> Result<(), String> {
    match names.iter().find(|n| !all.contains(n)) {
        Some(n) => {
            let hint = if n.contains(['*', '(', '|', '\\', '[']) { " (for a regex, write re:PATTERN)" } else { "" };
            Err(format!("\"{n}\" is not a hook point of this model{hint}; {EXAMPLES}"))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<String> {
        ["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.1.attn.hook_q"].map(String::from).to_vec()
    }

    #[test]
    fn exact_names_and_whole_name_regexes() {
        let s = HookSelection::parse("hook_embed, blocks.0.attn.hook_q", &all()).unwrap();
        assert!(s.matches("hook_embed") && s.matches("blocks.0.attn.hook_q") && !s.matches("blocks.1.attn.hook_q"));
        let r = HookSelection::parse(r"re:blocks\.\d+\.attn\.hook_q", &all()).unwrap();
        assert!(r.matches("blocks.0.attn.hook_q") && r.matches("blocks.1.attn.hook_q") && !r.matches("blocks.0.attn.hook_k"));
        // Whole names only: a prefix does not match.
        assert!(HookSelection::parse("re:blocks", &all()).unwrap_err().contains("matches no hook point"));
    }

    #[test]
    fn bad_selections_name_what_is_wrong() {
        assert!(HookSelection::parse("blocks.7.attn.hook_z", &all()).unwrap_err().starts_with("\"blocks.7.attn.hook_z\" is not a hook point of this model;"));
        assert!(HookSelection::parse(r"blocks\.0\.attn\.hook_(q|k)", &all()).unwrap_err().contains("for a regex, write re:PATTERN"));
        assert!(HookSelection::parse(" , ", &all()).unwrap_err().starts_with("no hook name given"));
        assert!(HookSelection::parse("re:(", &all()).unwrap_err().starts_with("invalid regex"));
    }
}
