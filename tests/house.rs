//! The shape of the code, checked: no function in `crates/` is longer than 80 lines, no
//! source file longer than 600, the Python package holds no library logic, the README's
//! layout table names every source file (and only files that exist), and
//! one encode and one decoder-norm fold exist (lens's dictionary), and
//! no two source files of a crate import each other in a loop (directly or through others). A file "imports" another when it names a path into
//! the other's module (`crate::a::b::Item`, `super::x`, and from a `mod.rs` or `lib.rs`
//! `self::x` or a child's bare `x::Item`), in a `use` or inline. Items of the crate root
//! (`crate::Error`) are the root's own and import nothing; declaring a child (`mod x;`) is
//! not an import; `#[cfg(test)]` modules are not counted (their `use super::*` is the file
//! itself).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The module path of a source file: `src/lib.rs` → `[]`, `src/a/mod.rs` and `src/a.rs` →
/// `[a]`, `src/a/b.rs` → `[a, b]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().to_string()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "lib" | "main" | "mod") {
        parts.push(stem.to_string());
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text of a file without comments and without its `#[cfg(test)]` tail.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap();
    body.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// Every path a file names from `root` (`crate`, `super` or `self`), braces expanded:
/// `crate::{a::{B, c}, d}` → `a::B`, `a::c`, `d`.
fn paths_from(code: &str, root: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let pat = format!("{root}::");
    let mut at = 0;
    while let Some(i) = code[at..].find(&pat) {
        let start = at + i;
        at = start + pat.len();
        let before = start.checked_sub(1).map(|j| bytes[j] as char);
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        expand(&code[at..], Vec::new(), &mut out);
    }
    out
}

/// Expand the path tree starting at `s` (after `prefix::`) into full paths.
fn expand(s: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let s_trim = s.trim_start();
    let skipped = s.len() - s_trim.len();
    if let Some(inner) = s_trim.strip_prefix('{') {
        let mut used = 1;
        let mut rest = inner;
        loop {
            let n = expand(rest, prefix.clone(), out);
            used += n;
            rest = &rest[n..];
            let t = rest.trim_start();
            used += rest.len() - t.len();
            rest = t;
            if let Some(r) = rest.strip_prefix(',') {
                used += 1;
                rest = r;
                if rest.trim_start().starts_with('}') {
                    let t = rest.trim_start();
                    used += rest.len() - t.len() + 1;
                    return skipped + used;
                }
                continue;
            }
            if let Some(_r) = rest.strip_prefix('}') {
                return skipped + used + 1;
            }
            return skipped + used;
        }
    }
    let ident: String = s_trim.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '*').collect();
    let mut path = prefix;
    if !ident.is_empty() {
        path.push(ident.clone());
    }
    let after = &s_trim[ident.len()..];
    if let Some(rest) = after.strip_prefix("::") {
        return skipped + ident.len() + 2 + expand(rest, path, out);
    }
    out.push(path);
    skipped + ident.len()
}

/// The file of the longest prefix of `path` that is a module of `modules`.
fn resolve(modules: &BTreeMap<Vec<String>, PathBuf>, path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| modules.get(&path[..n]).cloned())
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(v: &'a PathBuf, st: &mut State<'a>) {
        let i = st.index.len();
        st.index.insert(v, i);
        st.low.insert(v, i);
        st.stack.push(v);
        st.on.insert(v);
        for w in st.edges.get(v).into_iter().flatten() {
            if !st.index.contains_key(w) {
                visit(w, st);
                let lw = st.low[w];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if st.on.contains(w) {
                let iw = st.index[w];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = st.stack.pop().unwrap();
                st.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                st.out.push(comp);
            }
        }
    }
    let mut st = State { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in edges.keys() {
        if !st.index.contains_key(v) {
            visit(v, &mut st);
        }
    }
    st.out
}

/// The import edges between the files of one crate's `src`.
fn import_edges(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files.iter().map(|f| (module_of(src, f), f.clone())).collect();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for f in &files {
        let text = code(&std::fs::read_to_string(f).unwrap());
        let me = module_of(src, f);
        let is_dir_module = f.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        let mut targets = Vec::new();
        for p in paths_from(&text, "crate") {
            targets.push(p);
        }
        let parent: Vec<String> = me[..me.len().saturating_sub(1)].to_vec();
        for p in paths_from(&text, "super") {
            // From a.rs or a/mod.rs, `super` is a's parent; each further `super` one up.
            let mut path = parent.clone();
            for seg in p {
                if seg == "super" {
                    path.pop();
                } else {
                    path.push(seg);
                }
            }
            targets.push(path);
        }
        if is_dir_module {
            for p in paths_from(&text, "self") {
                targets.push(me.iter().cloned().chain(p).collect());
            }
            // A module file names its children by bare paths (`child::Item`).
            for child in modules.keys().filter(|m| m.len() == me.len() + 1 && m.starts_with(&me)) {
                let name = child.last().unwrap();
                for p in paths_from(&text, name) {
                    targets.push(child.iter().cloned().chain(p).collect());
                }
            }
        }
        let entry = edges.entry(f.clone()).or_default();
        for t in targets {
            if let Some(target) = resolve(&modules, &t).filter(|t| t != f) {
                entry.insert(target);
            }
        }
    }
    edges
}

#[test]
fn the_import_checker_sees_a_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("sae")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\npub mod sae;\n").unwrap();
    std::fs::write(src.join("c.rs"), "pub struct Leaf;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{b::{Thing, other}, sae};\n").unwrap();
    std::fs::write(src.join("b.rs"), "fn f() { crate::a::g(); }\n#[cfg(test)]\nmod tests { use crate::sae::X; }\n").unwrap();
    std::fs::write(src.join("sae/mod.rs"), "mod core;\nmod saelens;\npub use self::core::Sae;\nfn f() { saelens::load(); }\n").unwrap();
    std::fs::write(src.join("sae/saelens.rs"), "use super::core::Sae;\n").unwrap();
    std::fs::write(src.join("sae/core.rs"), "use super::super::c::Leaf;\n").unwrap();
    let edges = import_edges(&src);
    assert!(edges[&src.join("a.rs")].contains(&src.join("b.rs")));
    assert!(edges[&src.join("a.rs")].contains(&src.join("sae/mod.rs")));
    let sae_mod: Vec<_> = edges[&src.join("sae/mod.rs")].iter().cloned().collect();
    assert_eq!(sae_mod, [src.join("sae/core.rs"), src.join("sae/saelens.rs")], "a module file's children by self:: and bare paths");
    assert!(edges[&src.join("sae/saelens.rs")].contains(&src.join("sae/core.rs")));
    assert!(edges[&src.join("sae/core.rs")].contains(&src.join("c.rs")), "super::super");
    assert!(edges[&src.join("b.rs")].len() == 1, "test modules are not counted: {:?}", edges[&src.join("b.rs")]);
    let found = cycles(&edges);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 2);
}

#[test]
fn no_two_files_of_a_crate_import_each_other_in_a_loop() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates")).unwrap().flatten().map(|e| e.path().join("src")).filter(|p| p.is_dir()).collect();
    crates.push(root.join("src"));
    crates.push(root.join("xtask/src"));
    let mut loops = Vec::new();
    for src in &crates {
        for comp in cycles(&import_edges(src)) {
            let names: Vec<String> = comp.iter().map(|p| p.strip_prefix(root).unwrap().display().to_string()).collect();
            loops.push(names.join(" <-> "));
        }
    }
    assert!(loops.is_empty(), "files importing each other in a loop:\n{}", loops.join("\n"));
}

/// The functions of `text` longer than `limit` lines, as `(name, first line, length)`: a
/// function runs from its `fn` line to the line where its braces balance.
fn long_functions(text: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        let l = l.strip_prefix("pub(crate) ").or_else(|| l.strip_prefix("pub ")).unwrap_or(l);
        let l = l.strip_prefix("const ").unwrap_or(l);
        let l = l.strip_prefix("unsafe ").unwrap_or(l);
        let Some(rest) = l.strip_prefix("fn ") else {
            i += 1;
            continue;
        };
        if lines[i].trim_end().ends_with(';') {
            i += 1;
            continue;
        }
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let (mut depth, mut started, mut j) = (0i64, false, i);
        while j < lines.len() {
            depth += lines[j].matches('{').count() as i64 - lines[j].matches('}').count() as i64;
            started |= lines[j].contains('{');
            if started && depth <= 0 {
                break;
            }
            j += 1;
        }
        let len = j - i + 1;
        if len > limit {
            out.push((name, i + 1, len));
        }
        i = j + 1;
    }
    out
}

#[test]
fn the_length_checker_measures_functions() {
    let body: String = (0..90).map(|k| format!("    let x{k} = {{ {k} }};\n")).collect();
    let text = format!("fn short() {{\n    1\n}}\n\npub(crate) fn long() {{\n{body}}}\nfn declared();\n");
    assert_eq!(long_functions(&text, 80), vec![("long".to_string(), 5, 92)]);
    assert!(long_functions(&text, 92).is_empty());
}

#[test]
fn no_function_in_the_crates_is_longer_than_80_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = crate_sources(root);
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut long = Vec::new();
    for f in &files {
        for (name, line, len) in long_functions(&std::fs::read_to_string(f).unwrap(), 80) {
            long.push(format!("{}:{line} fn {name}: {len} lines", f.strip_prefix(root).unwrap().display()));
        }
    }
    assert!(long.is_empty(), "functions over 80 lines (split them into named steps):\n{}", long.join("\n"));
}

fn crate_sources(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        if e.path().join("src").is_dir() {
            rust_files(&e.path().join("src"), &mut files);
        }
    }
    files
}

#[test]
fn no_source_file_in_the_crates_is_longer_than_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = crate_sources(root);
    assert!(files.len() > 50, "found only {} files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 600).then(|| format!("{}: {n} lines", f.strip_prefix(root).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "source files over 600 lines (split them by concept):\n{}", long.join("\n"));
}

/// The calls of `name(` in `code`, each with its argument text (to the matching parenthesis).
fn call_arguments<'a>(code: &'a str, name: &str) -> Vec<&'a str> {
    let pat = format!("{name}(");
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find(&pat) {
        let start = at + i + pat.len();
        let mut depth = 1;
        let end = code[start..]
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map_or(code.len(), |(j, _)| start + j);
        out.push(&code[start..end]);
        at = start;
    }
    out
}

/// The second of a call's arguments (after the first comma outside brackets), or the whole
/// text for a method call's one argument.
fn second_argument(args: &str) -> &str {
    let mut depth = 0i32;
    for (i, c) in args.char_indices() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' => depth -= 1,
            ',' if depth == 0 => return args[i + 1..].trim(),
            _ => {}
        }
    }
    args
}

#[test]
fn the_call_finder_reads_whole_arguments() {
    let code = "let a = matmul(x, p.w_enc.clone()); let b = matmul(p.w_enc.clone(), g.reshape([m, 1]));";
    let args = call_arguments(code, "matmul");
    assert_eq!(args, vec!["x, p.w_enc.clone()", "p.w_enc.clone(), g.reshape([m, 1])"]);
    assert_eq!(args.iter().map(|a| second_argument(a)).collect::<Vec<_>>(), vec!["p.w_enc.clone()", "g.reshape([m, 1])"]);
}

/// Every product of tensors goes through `burnlens_model::matmul` (which keeps TF32 out on a
/// GPU unless asked for): no Burn `.matmul(` call elsewhere in the crates.
#[test]
fn every_product_takes_burnlens_matmul() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let home = root.join("crates/burnlens-model/src/matmul.rs");
    let direct: Vec<String> = crate_sources(root)
        .iter()
        .filter(|f| **f != home)
        .flat_map(|f| {
            let text = code(&std::fs::read_to_string(f).unwrap());
            let name = f.strip_prefix(root).unwrap().display().to_string();
            call_arguments(&text, ".matmul").into_iter().map(move |a| format!("{name}: .matmul({a})")).collect::<Vec<_>>()
        })
        .collect();
    assert!(direct.is_empty(), "Burn's matmul called directly (use burnlens_model::matmul::matmul):\n{}", direct.join("\n"));
}

/// One sparse dictionary encodes, and folds its decoder norms, for every tool: outside
/// `lens::dictionary` no product takes an encoder as its right-hand side (`x · W_enc`, an
/// encode written again) and nobody defines another fold or another pre-activation.
#[test]
fn one_encode_and_one_decoder_norm_fold_in_the_workspace() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = crate_sources(root);
    let dictionary = root.join("crates/burnlens-lens/src/dictionary");
    let (mut copies, mut folds, mut pres) = (Vec::new(), Vec::new(), Vec::new());
    for f in &files {
        let text = code(&std::fs::read_to_string(f).unwrap());
        let name = f.strip_prefix(root).unwrap().display().to_string();
        let ours = f.starts_with(&dictionary);
        for args in call_arguments(&text, "matmul") {
            let rhs = second_argument(args);
            if !ours && (rhs.contains("w_enc") || rhs.contains("W_enc")) {
                copies.push(format!("{name}: matmul({args})"));
            }
        }
        folds.extend(text.matches("fn fold_decoder_norms").map(|_| name.clone()));
        pres.extend(text.matches("fn pre(").chain(text.matches("fn pre_into(")).map(|_| name.clone()));
    }
    assert!(copies.is_empty(), "encodes written outside lens::dictionary (call Dictionary::pre/encode):\n{}", copies.join("\n"));
    assert_eq!(folds, vec!["crates/burnlens-lens/src/dictionary/mod.rs".to_string()], "decoder-norm folds");
    assert_eq!(pres.len(), 2, "pre-activations defined in {pres:?}");
    assert!(pres.iter().all(|p| p.starts_with("crates/burnlens-lens/src/dictionary/")), "pre-activations defined in {pres:?}");
}

/// The Python package keeps what needs Python (hook functions, the cache as a dict) and
/// TransformerLens's aliases: the classes a user holds are the extension's, and results
/// cross as Python objects built in Rust, not JSON text to decode or rows to lay out again.
#[test]
fn the_python_package_holds_no_library_logic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let init = std::fs::read_to_string(root.join("crates/burnlens-py/python/burnlens/__init__.py")).unwrap();
    for (found, why) in [
        ("json.loads", "results come from the extension as Python objects"),
        ("np.stack", "stacks of activations are built in Rust (`_native.residual`, `accumulated_resid`)"),
        ("np.zeros((", "patching grids are laid out in Rust (`burnlens_lens::patching::grid`)"),
        ("class Config", "the configuration is the extension's `Config` (`burnlens_lens::TlConfig`)"),
        ("class Graph", "graphs are the extension's `Graph`"),
        ("class SAE", "SAEs are the extension's `SAE`"),
    ] {
        assert!(!init.contains(found), "__init__.py has `{found}`: {why}");
    }
    for alias in ["Config = _native.Config", "SAE = _native.SAE", "Transcoders = _native.Transcoders", "Graph = _native.Graph"] {
        assert!(init.contains(alias), "__init__.py should alias the extension's class: `{alias}`");
    }
}

/// The README's layout table: each row's path and the file names it gives in backticks.
fn layout_rows(readme: &str) -> Vec<(String, Vec<String>)> {
    let start = readme.find("\n## Layout").expect("README has a Layout section");
    let end = readme[start + 1..].find("\n## ").map_or(readme.len(), |e| start + 1 + e);
    let ticked = |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_string).collect() };
    readme[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            let path = ticked(cells[1]).remove(0).trim_end_matches('/').to_string();
            (path, ticked(&cells[2..].join("|")).into_iter().filter(|t| t.ends_with(".rs")).collect())
        })
        .collect()
}

/// Every source file of the crates is named in the README's layout table, in the row of the
/// deepest folder holding it (a crate, or `crates/burnlens-model/src/kernels`), and every
/// file a row names exists there: the map a newcomer reads matches the tree. Module roots
/// (`lib.rs`, `mod.rs`, `main.rs`) and unit-test files (`tests.rs`) need no entry.
#[test]
fn the_readme_layout_names_every_source_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rows = layout_rows(&std::fs::read_to_string(root.join("README.md")).unwrap());
    assert!(rows.len() > 10, "found {} layout rows", rows.len());
    let mut problems = Vec::new();
    for (path, names) in &rows {
        for name in names.iter().filter(|n| !n.contains("::") && !n.starts_with("burnlens")) {
            let under = root.join(path);
            let found = root.join(name).is_file() || under.join(name).is_file() || under.join("src").join(name).is_file() || {
                let mut all = Vec::new();
                if under.is_dir() {
                    rust_files(&under, &mut all);
                }
                all.iter().any(|f| f.ends_with(name))
            };
            if !found {
                problems.push(format!("`{name}` in the row of {path} is not a file there"));
            }
        }
    }
    for file in crate_sources(root) {
        let rel = file.strip_prefix(root).unwrap();
        let base = rel.file_name().unwrap().to_string_lossy().to_string();
        if ["lib.rs", "mod.rs", "main.rs", "tests.rs"].contains(&base.as_str()) {
            continue;
        }
        let row = rows.iter().filter(|(p, _)| rel.starts_with(p)).max_by_key(|(p, _)| p.len());
        match row {
            Some((p, names)) if names.iter().any(|n| rel.ends_with(n) || *n == base) => {}
            Some((p, _)) => problems.push(format!("{} is not named in the layout row of {p}", rel.display())),
            None => problems.push(format!("{} has no layout row", rel.display())),
        }
    }
    assert!(problems.is_empty(), "README.md's layout table and the tree differ:\n{}", problems.join("\n"));
}
