//! The HTML attention viewer in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`), driven over WebDriver: every head renders, a real pointer hover shows
//! the (destination, source, value) tooltip, masked cells say so, a click enlarges a head.
//! Set `BURNLENS_SKIP_BROWSER=1` to skip on a machine without Chromium; CI installs it.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use burn::tensor::Device;
use burnlens::hf::load_model;
use burnlens::lens::report::{analyze, write_analysis};
use common::*;
use serde_json::{Value, json};

struct Driver {
    child: Child,
    base: String,
    session: String,
}

impl Driver {
    fn start(profile: &Path) -> Option<Driver> {
        let (chromium, driver) = (Path::new("/usr/bin/chromium"), Path::new("/usr/bin/chromedriver"));
        if !chromium.exists() || !driver.exists() {
            if std::env::var("BURNLENS_SKIP_BROWSER").is_ok() {
                eprintln!("skipping: chromium / chromedriver not installed");
                return None;
            }
            panic!("chromium and chromedriver are needed (apt-get install chromium chromium-driver), or set BURNLENS_SKIP_BROWSER=1");
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(driver).arg(format!("--port={port}")).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let t0 = Instant::now();
        while ureq::get(&format!("{base}/status")).call().is_err() {
            assert!(t0.elapsed() < Duration::from_secs(20), "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     format!("--user-data-dir={}", profile.display()), "--window-size=1400,1100"]}}}});
        let mut d = Driver { child, base, session: String::new() };
        let v = d.post("/session", caps);
        d.session = v["value"]["sessionId"].as_str().expect("session id").to_string();
        Some(d)
    }

    fn post(&self, path: &str, body: Value) -> Value {
        let url = format!("{}{}", self.base, path);
        let mut resp = ureq::post(&url).header("Content-Type", "application/json").send(body.to_string()).unwrap_or_else(|e| panic!("POST {path}: {e}"));
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
    }

    fn get(&self, path: &str) -> Value {
        let url = format!("{}/session/{}{}", self.base, self.session, path);
        let mut resp = ureq::get(&url).call().unwrap();
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
    }

    fn cmd(&self, path: &str, body: Value) -> Value {
        self.post(&format!("/session/{}{}", self.session, path), body)["value"].clone()
    }

    fn js(&self, script: &str) -> Value {
        self.cmd("/execute/sync", json!({"script": script, "args": []}))
    }

    /// A real pointer move to viewport coordinates (x, y).
    fn hover(&self, x: f64, y: f64) {
        self.cmd(
            "/actions",
            json!({"actions": [{"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
            "actions": [{"type": "pointerMove", "duration": 50, "origin": "viewport", "x": x.round() as i64, "y": y.round() as i64}]}]}),
        );
    }

    fn click(&self, x: f64, y: f64) {
        self.cmd(
            "/actions",
            json!({"actions": [{"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
            "actions": [{"type": "pointerMove", "duration": 0, "origin": "viewport", "x": x.round() as i64, "y": y.round() as i64},
                        {"type": "pointerDown", "button": 0}, {"type": "pointerUp", "button": 0}]}]}),
        );
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = ureq::delete(&format!("{}/session/{}", self.base, self.session)).call();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Centre of cell (q, k) of a canvas, in viewport coordinates.
fn cell_centre(d: &Driver, canvas: &str, q: usize, k: usize) -> (f64, f64) {
    let v = d.js(&format!(
        "const c = document.querySelector('{canvas}'); c.scrollIntoView({{block: 'center'}}); const r = c.getBoundingClientRect(); \
         return [r.left, r.top, +c.dataset.cell, +c.dataset.x0, +c.dataset.y0];"
    ));
    let f = |i: usize| v[i].as_f64().unwrap();
    (f(0) + f(3) + (k as f64 + 0.5) * f(2), f(1) + f(4) + (q as f64 + 0.5) * f(2))
}

#[test]
fn attention_viewer_renders_every_head_and_hover_shows_values() {
    let tmp = tempfile::tempdir().unwrap();
    let model = load_model(&fixture("gpt2"), &Device::flex()).unwrap().model;
    let ids: Vec<i64> = vec![12, 7, 99, 3, 42, 7, 99, 3, 5, 64, 0, 127];
    let labels: Vec<String> = ids.iter().map(|i| format!("tok{i}")).collect();
    let analysis = analyze(&model, &ids, labels);
    let report = tmp.path().join("report");
    write_analysis(&report, &analysis, "browser test").unwrap();
    let Some(d) = Driver::start(&tmp.path().join("profile")) else { return };
    d.cmd("/url", json!({"url": format!("file://{}", report.join("index.html").display())}));

    // Every head of layer 0 drew a non-blank canvas.
    let drawn = d.js("return [...document.querySelectorAll('canvas.bl-small')].map(c => { \
        const p = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let ink = 0; \
        for (let i = 0; i < p.length; i += 4) if (p[i] < 250 || p[i+1] < 250) ink++; return ink; });");
    let drawn: Vec<u64> = drawn.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(drawn.len(), 4, "one canvas per head");
    assert!(drawn.iter().all(|&n| n > 0), "blank head canvases: {drawn:?}");

    // Hover cell (destination 5, source 1) of head 2: the tooltip names both tokens and the value.
    let t = ids.len();
    let want = analysis.patterns[0][(2 * t + 5) * t + 1];
    let (x, y) = cell_centre(&d, "#bl-head-2", 5, 1);
    d.hover(x, y);
    let tip = d.js("const t = document.getElementById('bl-tip'); return [t.style.display, t.textContent, t.dataset.value];");
    assert_eq!(tip[0], "block", "tooltip hidden after hover: {tip}");
    let text = tip[1].as_str().unwrap();
    assert!(text.contains("destination 5 \"tok7\"") && text.contains("source 1 \"tok7\""), "{text}");
    let shown: f32 = tip[2].as_str().unwrap().parse().unwrap();
    assert!((shown - want).abs() < 1e-4, "tooltip shows {shown}, pattern is {want}");

    // A masked (future) cell says so.
    let (x, y) = cell_centre(&d, "#bl-head-2", 1, 5);
    d.hover(x, y);
    let text = d.js("return document.getElementById('bl-tip').textContent;");
    assert!(text.as_str().unwrap().contains("masked"), "{text}");

    // Clicking head 3 enlarges it with token labels; other layers switch the grid.
    let (x, y) = cell_centre(&d, "#bl-head-3", 0, 0);
    d.click(x, y);
    let title = d.js("return document.getElementById('bl-big').textContent;");
    assert!(title.as_str().unwrap().contains("Layer 0, head 3"), "{title}");
    let (x, y) = cell_centre(&d, "#bl-big-canvas", 4, 2);
    d.hover(x, y);
    let tip = d.js("return document.getElementById('bl-tip').dataset;");
    assert_eq!((tip["head"].as_str(), tip["q"].as_str(), tip["k"].as_str()), (Some("3"), Some("4"), Some("2")));
    d.js("document.getElementById('bl-layer-2').click(); return 0;");
    let caption = d.js("return document.querySelector('.bl-head div').textContent;");
    assert_eq!(caption, "L2H0");

    // Keep a screenshot for people to look at.
    let shot = d.get("/screenshot");
    let png = base64_decode(shot["value"].as_str().unwrap());
    assert!(png.starts_with(b"\x89PNG"));
    let out = std::env::var("BURNLENS_SCREENSHOT").map(PathBuf::from).unwrap_or_else(|_| tmp.path().join("viewer.png"));
    std::fs::write(&out, png).unwrap();
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &c)| acc | (val(c) as u32) << (18 - 6 * i));
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}

/// Computed background colour of an element as `[r, g, b, a]`.
fn parse_rgb(s: &str) -> [f64; 4] {
    let inner = s.trim_start_matches("rgba(").trim_start_matches("rgb(").trim_end_matches(')');
    let v: Vec<f64> = inner.split(',').map(|x| x.trim().parse().unwrap()).collect();
    [v[0], v[1], v[2], *v.get(3).unwrap_or(&1.0)]
}

#[test]
fn coloured_tokens_and_the_tool_reports_render() {
    let tmp = tempfile::tempdir().unwrap();
    let model = load_model(&fixture("trained_gpt2_char"), &Device::flex()).unwrap().model;
    let ids: Vec<i64> = vec![18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43, 52];
    let labels: Vec<String> = ids.iter().map(|i| format!("t{i}")).collect();
    let analysis = analyze(&model, &ids, labels.clone());
    let report = tmp.path().join("report");
    write_analysis(&report, &analysis, "coloured tokens").unwrap();
    let Some(d) = Driver::start(&tmp.path().join("profile")) else { return };
    d.cmd("/url", json!({"url": format!("file://{}", report.join("index.html").display())}));

    // One visible span per token, coloured by the log-probability the model gave it.
    let spans = d.js("return [...document.querySelectorAll('.bl-tokens .bl-tok')].map(s => { const r = s.getBoundingClientRect(); \
        return [s.textContent, s.dataset.value, getComputedStyle(s).backgroundColor, r.width, r.height]; });");
    let spans = spans.as_array().unwrap();
    assert_eq!(spans.len(), ids.len());
    assert!(spans.iter().all(|s| s[3].as_f64().unwrap() > 0.0 && s[4].as_f64().unwrap() > 0.0), "every token is laid out: {spans:?}");
    assert_eq!(spans[0][1], "n/a", "nothing predicts the first token");
    assert_eq!(parse_rgb(spans[0][2].as_str().unwrap())[3], 0.0, "the first token is uncoloured");
    let values: Vec<(usize, f64)> = (1..ids.len()).map(|i| (i, spans[i][1].as_str().unwrap().parse::<f64>().unwrap())).collect();
    for &(i, v) in &values {
        let want = analysis.token_logprobs[i - 1].unwrap();
        assert!((v - want).abs() < 1e-3, "token {i}: shows {v}, log p is {want}");
    }
    let (hi, _) = values.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let (lo, _) = values.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let (h, l) = (parse_rgb(spans[hi][2].as_str().unwrap()), parse_rgb(spans[lo][2].as_str().unwrap()));
    assert!(h[0] == 255.0 && h[2] < 10.0, "the likeliest token is red: {h:?}");
    assert!(l[2] == 255.0 && l[0] < 10.0, "the least likely token is blue: {l:?}");

    // The patching report: one drawn point per node in the scatter plot, the correlation shown.
    use burnlens::lens::tool_reports::{PatchingReport, write_patching};
    use burnlens::lens::{Metric, NodeKind, compare_patching};
    let mut corrupted = ids.clone();
    corrupted[3] = 20;
    let result = compare_patching(&model, &ids, &corrupted, &Metric::Loss { from: 4 }, &NodeKind::ALL, true).unwrap();
    let n = result.nodes.len();
    let r = PatchingReport {
        clean_ids: ids.clone(),
        clean_tokens: labels.clone(),
        corrupted_ids: corrupted.clone(),
        corrupted_tokens: corrupted.iter().map(|i| format!("t{i}")).collect(),
        direction: "noising".into(),
        n_layers: model.config.n_layers(),
        n_heads: model.config.n_heads,
        result,
    };
    let dir = tmp.path().join("patch");
    write_patching(&dir, &r, "patching").unwrap();
    d.cmd("/url", json!({"url": format!("file://{}", dir.join("index.html").display())}));
    let points = d.js("return [...document.querySelectorAll('circle.bl-point')].filter(c => c.getBoundingClientRect().width > 0).length;");
    assert_eq!(points.as_u64().unwrap() as usize, n);
    let text = d.js("return document.querySelector('.bl-correlation').textContent;");
    assert!(text.as_str().unwrap().contains(&format!("{:.3}", r.result.correlation.unwrap())), "{text}");
    // The corrupted token is the only red one in the corrupted sequence.
    let red = d.js("return [...document.querySelectorAll('.bl-tokens')][1].querySelectorAll('.bl-tok').length;");
    assert_eq!(red.as_u64().unwrap() as usize, ids.len());
    let colours =
        d.js("return [...[...document.querySelectorAll('.bl-tokens')][1].querySelectorAll('.bl-tok')].map(s => getComputedStyle(s).backgroundColor);");
    let reds: Vec<usize> = colours.as_array().unwrap().iter().enumerate().filter(|(_, c)| parse_rgb(c.as_str().unwrap())[2] < 10.0).map(|(i, _)| i).collect();
    assert_eq!(reds, vec![3]);
}

#[test]
fn the_lens_attribution_and_sae_reports_render() {
    use burnlens::lens::sae::{Sae, run_sae};
    use burnlens::lens::tool_reports::{AttributionReport, LensReport, SaeReport, write_attribution, write_lens, write_sae};
    use burnlens::lens::{direct_logit_attribution, logit_lens};
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex();
    let model = load_model(&fixture("llama_gqa"), &device).unwrap().model;
    let ids: Vec<i64> = vec![5, 17, 33, 2, 90, 12, 7];
    let tokens: Vec<String> = ids.iter().map(|i| format!("t{i}")).collect();
    let (l, h, t) = (model.config.n_layers(), model.config.n_heads, ids.len());

    let lens = logit_lens(&model, &ids, 3, None);
    let top_tokens = lens.top.iter().map(|layer| layer.iter().map(|pos| pos.iter().map(|(id, _)| format!("t{id}")).collect()).collect()).collect();
    let lens_dir = tmp.path().join("lens");
    write_lens(&lens_dir, &LensReport { ids: ids.clone(), tokens: tokens.clone(), top_tokens, lens: lens.clone() }, "lens").unwrap();
    let dla = direct_logit_attribution(&model, &ids, 3, Some(9));
    let dla_dir = tmp.path().join("dla");
    let report =
        AttributionReport { ids: ids.clone(), tokens: tokens.clone(), target: "logit[3] - logit[9]".into(), position: t - 1, n_layers: l, n_heads: h, dla };
    write_attribution(&dla_dir, &report, "dla").unwrap();
    let sae = Sae::load(&fixture("sae").join("jumprelu_llama_resid"), &device).unwrap();
    let run = run_sae(&model, &sae, &ids, 3).unwrap();
    let sae_dir = tmp.path().join("sae");
    write_sae(&sae_dir, &SaeReport { ids: ids.clone(), tokens: tokens.clone(), sae: sae.cfg.clone(), run }, "sae").unwrap();

    let Some(d) = Driver::start(&tmp.path().join("profile")) else { return };
    let open = |dir: &Path| {
        d.cmd("/url", json!({"url": format!("file://{}", dir.join("index.html").display())}));
    };
    // Lens: one row per layer reading, one cell per position, the top token's text in it.
    open(&lens_dir);
    let table = d.js("const rows = [...document.querySelectorAll('table.bl-lens tr')].slice(1); \
        return rows.map(r => [...r.querySelectorAll('td')].map(c => [c.textContent, c.getBoundingClientRect().width > 0]));");
    let rows = table.as_array().unwrap();
    assert_eq!(rows.len(), l + 1);
    for (li, row) in rows.iter().enumerate() {
        let cells = row.as_array().unwrap();
        assert_eq!(cells.len(), t);
        for (p, c) in cells.iter().enumerate() {
            assert_eq!(c[0].as_str().unwrap(), format!("{:?}", format!("t{}", lens.top[li][p][0].0)), "layer {li} pos {p}");
            assert_eq!(c[1], true);
        }
    }
    // Attribution: a heatmap cell per head and per component x position, drawn.
    open(&dla_dir);
    let rects = d.js("return [...document.querySelectorAll('svg')].map(s => [...s.querySelectorAll('rect title')].length);");
    let counts: Vec<u64> = rects.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert!(counts.contains(&((l * h) as u64)), "{counts:?}");
    assert!(counts.contains(&((report.dla.labels.len() * t) as u64)), "{counts:?}");
    let toks = d.js("return document.querySelectorAll('.bl-tokens .bl-tok').length;");
    assert_eq!(toks.as_u64().unwrap() as usize, t);
    // SAE: coloured tokens for the loss increase, L0 and the strongest feature, and a row
    // per position.
    open(&sae_dir);
    let spans = d.js("return [...document.querySelectorAll('.bl-tokens')].map(b => b.querySelectorAll('.bl-tok').length);");
    assert_eq!(spans, json!([t, t, t]));
    let rows = d.js("return document.querySelectorAll('table')[1].querySelectorAll('tr').length;");
    assert_eq!(rows.as_u64().unwrap() as usize, t + 1);
}

/// The gpt2 trace fixture's model and transcoders, and their graph of one prompt.
fn gpt2_graph() -> (burnlens::Transformer, burnlens::trace::TranscoderSet, Vec<i64>, burnlens::trace::Graph) {
    use burnlens::trace::{AttributeOptions, TranscoderSet, attribute};
    let device = Device::flex();
    let case = fixture("trace").join("gpt2");
    let model = load_model(&case.join("model"), &device).unwrap().model;
    let set = TranscoderSet::load(&case.join("transcoders"), &device).unwrap();
    let ids: Vec<i64> = vec![1, 17, 5, 60, 33, 2, 71, 12, 44];
    let graph = attribute(&model, &set, &ids, &AttributeOptions::default()).unwrap();
    (model, set, ids, graph)
}

/// A real click on the graph view's node `id`.
fn click_node(d: &Driver, id: &str) {
    let at = d.js(&format!(
        "const c = document.querySelector('circle.node[data-id=\"{id}\"]'); c.scrollIntoView({{block: 'center'}}); \
        const r = c.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2];"
    ));
    d.click(at[0].as_f64().unwrap(), at[1].as_f64().unwrap());
}

#[test]
fn the_attribution_graph_view_renders_and_a_click_lists_a_nodes_edges() {
    use burnlens::trace::{GraphText, write_graph};
    let tmp = tempfile::tempdir().unwrap();
    let (_, _, ids, graph) = gpt2_graph();
    let tokens: Vec<String> = ids.iter().map(|i| format!("t{i}")).collect();
    let logit_tokens = graph.logit_token_ids.iter().map(|i| format!("t{i}")).collect();
    let text = GraphText { slug: "g".into(), prompt: tokens.join(" "), prompt_tokens: tokens, logit_tokens };
    let out = tmp.path().join("graph");
    let files = write_graph(&out, &graph, &text, 0.8, 0.98).unwrap();
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    let (nodes, links) = (json["nodes"].as_array().unwrap(), json["links"].as_array().unwrap());

    let Some(d) = Driver::start(&tmp.path().join("profile")) else { return };
    d.cmd("/url", json!({"url": format!("file://{}", files.html.display())}));
    // Every node a circle with a position inside the picture, every link a line.
    let drawn = d.js("const s = document.getElementById('view').getBoundingClientRect(); \
        return [...document.querySelectorAll('circle.node')].map(c => { const r = c.getBoundingClientRect(); \
        return [c.dataset.id, r.width > 0 && r.left >= s.left && r.right <= s.right && r.top >= s.top && r.bottom <= s.bottom]; });");
    let drawn = drawn.as_array().unwrap();
    assert_eq!(drawn.len(), nodes.len());
    for (c, n) in drawn.iter().zip(nodes) {
        assert_eq!(c[0], n["node_id"]);
        assert_eq!(c[1], true, "{} drawn inside the view", n["node_id"]);
    }
    assert_eq!(d.js("return document.querySelectorAll('line.edge').length;").as_u64().unwrap() as usize, links.len());
    assert_eq!(d.js("return document.querySelectorAll('text.tok').length;").as_u64().unwrap() as usize, ids.len());
    // A real click on the node with the most incoming links lists them, strongest first.
    let target = nodes.iter().max_by_key(|n| links.iter().filter(|l| l["target"] == n["node_id"]).count()).unwrap()["node_id"].as_str().unwrap().to_string();
    let incoming: Vec<f64> = links.iter().filter(|l| l["target"] == target.as_str()).map(|l| l["weight"].as_f64().unwrap()).collect();
    click_node(&d, &target);
    let panel = d.js("return [document.querySelector('#panel h4#inputs').textContent, \
        [...document.querySelector('#panel h4#inputs').nextElementSibling.querySelectorAll('tr')].map(r => +r.cells[1].textContent), \
        document.querySelector('circle.node.sel').dataset.id];");
    assert_eq!(panel[2].as_str().unwrap(), target);
    assert_eq!(panel[0].as_str().unwrap(), format!("strongest inputs ({})", incoming.len().min(10)));
    let shown: Vec<f64> = panel[1].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let mut want = incoming.clone();
    want.sort_by(|a, b| b.abs().total_cmp(&a.abs()));
    assert_eq!(shown.len(), want.len().min(10));
    for (s, w) in shown.iter().zip(&want) {
        assert!((s - w).abs() <= 5e-3 * w.abs().max(1e-9), "{s} against {w} (shown to 3 digits)");
    }
}

#[test]
fn the_feature_dashboard_browser_lists_features_and_opens_one_with_its_examples_highlighted() {
    use burnlens::dashboards::{DashboardConfig, FeatureSource, RunInfo, RunSpec, run, write_all};
    use burnlens::lens::sae::Sae;
    let tmp = tempfile::tempdir().unwrap();
    let device = Device::flex();
    let dir = fixture("dashboards").join("standard_resid");
    let tokens: Vec<Vec<u32>> = serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap();
    let model = load_model(&fixture("gpt2"), &device).unwrap().model;
    let sae = Sae::load(&dir.join("sae"), &device).unwrap();
    let source = FeatureSource::new(&model, &sae, None).unwrap();
    let cfg = DashboardConfig { ignore_tokens: vec![0], ..DashboardConfig::default() };
    let spec = RunSpec { cfg: cfg.clone(), tokens: 48 * 32, batch_windows: 16, spill: None, ranks: Default::default(), place: None };
    let out = run(&source, &spec, None, &mut || Ok(Box::new(burnlens::data::Counted::new(tokens.clone().into_iter().map(Ok)))), &mut |_| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    let info = RunInfo { model_id: "gpt2", layer: 1, sae_set: "standard_resid", dataset: "fixed", tokens: out.tokens, seq_len: 32, extra: json!({}) };
    // Tokens with markup in them, shown as text.
    let tok = |t: u32| format!("<t{t}>");
    let index = write_all(&tmp.path().join("dash"), &out.dashboards, &cfg, &info, &tok).unwrap();

    let Some(d) = Driver::start(&tmp.path().join("profile")) else { return };
    d.cmd("/url", json!({"url": format!("file://{}", index.display())}));
    assert_eq!(d.js("return document.querySelectorAll('#features tbody tr').length;").as_u64().unwrap(), 48);
    // Open the feature with the largest maximum through the search box.
    let f = out.dashboards.iter().max_by(|a, b| a.max.total_cmp(&b.max)).unwrap();
    d.js(&format!("const s = document.getElementById('search'); s.value = '{}'; document.getElementById('go').click();", f.feature));
    let t0 = Instant::now();
    while d.js("return !!document.getElementById('stats');") != json!(true) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the feature page did not load");
        std::thread::sleep(Duration::from_millis(50));
    }
    let page = d.js("return [document.querySelector('#feature h2').textContent, document.querySelectorAll('#groups .ex').length, \
        document.querySelectorAll('#feature svg .bar').length, document.querySelectorAll('#logits tr').length - 1];");
    let shown: usize = f.top.len() + f.quantiles.iter().map(|q| q.examples.len()).sum::<usize>();
    assert_eq!(page, json!([format!("Feature {}", f.feature), shown, f.acts_histogram.heights.len(), 10]));
    // The top example's own token is the highlighted one, coloured at full strength, with
    // its activation as the tooltip; the tokens are text, not markup.
    let top = &f.top[0];
    let centre = d.js("const c = document.querySelector('#groups .ex .tok.centre'); \
        return [c.textContent, getComputedStyle(c).backgroundColor, c.title, c.parentElement.dataset.window, c.parentElement.dataset.position];");
    assert_eq!(centre[0].as_str().unwrap(), format!("<t{}>", top.tokens[5]));
    assert_eq!(parse_rgb(centre[1].as_str().unwrap())[3], 1.0, "{centre}");
    assert_eq!(centre[2].as_str().unwrap(), format!("{:.4}", top.value));
    assert_eq!((centre[3].as_str().unwrap(), centre[4].as_str().unwrap()), (top.window.to_string().as_str(), top.position.to_string().as_str()));
    // An unknown id says so.
    d.js("location.hash = 'f=4800';");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(d.js("return document.getElementById('missing').textContent;"), json!("no feature 4800 in these dashboards"));
}

#[test]
fn a_click_on_a_feature_node_shows_its_dashboard_examples() {
    use burnlens::dashboards::{DashboardConfig, FeatureSource, RunSpec, node_fields, run};
    use burnlens::trace::{GraphText, write_graph_with};
    let tmp = tempfile::tempdir().unwrap();
    let (model, set, ids, graph) = gpt2_graph();
    // Dashboards over random windows of the model's vocabulary.
    let windows: Vec<Vec<u32>> = (0..64u32).map(|w| (0..16u32).map(|p| (w * 31 + p * 17 + w * p) % 96).collect()).collect();
    let source = FeatureSource::transcoders(&model, set.clone(), None).unwrap();
    let cfg = DashboardConfig::default();
    let out = run(
        &source,
        &RunSpec { cfg: cfg.clone(), tokens: 1024, batch_windows: 8, spill: None, ranks: Default::default(), place: None },
        None,
        &mut || Ok(Box::new(burnlens::data::Counted::new(windows.clone().into_iter().map(Ok)))),
        &mut |_| std::ops::ControlFlow::Continue(()),
    )
    .unwrap();
    let tok = |t: u32| format!("t{t}");
    let text = GraphText {
        slug: "g".into(),
        prompt: String::new(),
        prompt_tokens: ids.iter().map(|&i| tok(i as u32)).collect(),
        logit_tokens: graph.logit_token_ids.iter().map(|&i| tok(i as u32)).collect(),
    };
    let mut annotate = |n: &mut burnlens::trace::Node| {
        if let Some((layer, index)) = n.transcoder_feature() {
            let d = out.dashboards.iter().find(|d| d.layer == Some(layer) && d.feature == index).unwrap();
            let (label, dash) = node_fields(d, &cfg, &tok);
            (n.clerp, n.dashboard) = (label, Some(dash));
        }
    };
    let files = write_graph_with(&tmp.path().join("graph"), &graph, &text, 0.8, 0.98, &mut annotate, None).unwrap();
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    let node = json["nodes"].as_array().unwrap().iter().find(|n| n["dashboard"].is_object()).unwrap();
    let id = node["node_id"].as_str().unwrap();

    let Some(d) = Driver::start(&tmp.path().join("profile")) else { return };
    d.cmd("/url", json!({"url": format!("file://{}", files.html.display())}));
    click_node(&d, id);
    let shown = d.js("const b = document.getElementById('dashboard'); return [b.querySelectorAll('.ex').length, \
        b.querySelector('.ex .tok.centre').textContent, getComputedStyle(b.querySelector('.ex .tok.centre')).backgroundColor, b.querySelector('p.promotes').textContent];");
    let examples = node["dashboard"]["examples"].as_array().unwrap();
    assert_eq!(shown[0].as_u64().unwrap() as usize, examples.len());
    assert_eq!(shown[1], examples[0]["tokens"][5]);
    assert_eq!(parse_rgb(shown[2].as_str().unwrap())[3], 1.0, "the top example's own token at full colour");
    assert!(shown[3].as_str().unwrap().starts_with("promotes: "));
}

/// With `graph --qk`'s extension, a click on a node lists the heads carrying each input edge
/// that crosses positions; a real click on a head shows its attention row at the edge's
/// target (largest weight first, as graph.json holds it) and its largest QK terms; a click
/// on an edge lists the heads that carry it.
#[test]
fn a_click_on_a_head_shows_its_attention_row_and_qk_terms() {
    use burnlens::trace::{AttentionOptions, AttributeOptions, GraphText, Pruned, Replacement, graph_attention, write_graph_with};
    let tmp = tempfile::tempdir().unwrap();
    let (model, set, ids, graph) = gpt2_graph();
    let tokens: Vec<String> = ids.iter().map(|i| format!("t{i}")).collect();
    let logit_tokens = graph.logit_token_ids.iter().map(|i| format!("t{i}")).collect();
    let text = GraphText { slug: "g".into(), prompt: tokens.join(" "), prompt_tokens: tokens, logit_tokens };
    let opts = AttributeOptions::default();
    let rm = Replacement::new(&model, &set, &graph.input_tokens, opts.zero_positions, opts.pattern_budget).unwrap();
    let attention = |p: &Pruned| graph_attention(&rm, &graph, p, &opts, &AttentionOptions::default());
    let files = write_graph_with(&tmp.path().join("graph"), &graph, &text, 0.8, 0.98, &mut |_| {}, Some(&attention)).unwrap();
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    let links = json["links"].as_array().unwrap();
    // The node with the most incoming links that have heads, and its strongest such input.
    let with_heads = |t: &Value| links.iter().filter(|l| &l["target"] == t && l["heads"].is_array()).count();
    let target = json["nodes"].as_array().unwrap().iter().map(|n| &n["node_id"]).max_by_key(|t| with_heads(t)).unwrap().clone();
    assert!(with_heads(&target) > 0, "some link carries heads");
    let q = json["nodes"].as_array().unwrap().iter().find(|n| n["node_id"] == target).unwrap()["ctx_idx"].as_u64().unwrap();

    let Some(d) = Driver::start(&tmp.path().join("profile")) else { return };
    d.cmd("/url", json!({"url": format!("file://{}", files.html.display())}));
    click_node(&d, target.as_str().unwrap());
    let heads = d.js("return [...document.querySelectorAll('#panel a.head')].map(a => [+a.dataset.layer, +a.dataset.head, +a.dataset.query]);");
    let heads = heads.as_array().unwrap();
    assert!(!heads.is_empty(), "the inputs list their heads");
    let (layer, head) = (heads[0][0].as_u64().unwrap(), heads[0][1].as_u64().unwrap());
    assert_eq!(heads[0][2].as_u64().unwrap(), q, "a head is shown at the edge's target position");
    let at = d.js("const a = document.querySelector('#panel a.head'); a.scrollIntoView({block: 'center'}); const r = a.getBoundingClientRect(); \
        return [r.left + r.width / 2, r.top + r.height / 2];");
    d.click(at[0].as_f64().unwrap(), at[1].as_f64().unwrap());
    let shown = d.js("const h = document.getElementById('head'); return [h.querySelector('h4').textContent, \
        [...h.querySelector('table').querySelectorAll('tr')].map(r => +r.cells[1].textContent), h.querySelectorAll('table.qk tr').length, \
        h.querySelector('table.qk tr').cells[0].textContent];");
    assert!(shown[0].as_str().unwrap().starts_with(&format!("L{layer}.H{head} at ")), "{shown}");
    let mut want: Vec<(f64, &Value)> = json["qk"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["layer"].as_u64() == Some(layer) && r["head"].as_u64() == Some(head) && r["query"].as_u64() == Some(q))
        .map(|r| (r["pattern"].as_f64().unwrap(), r))
        .collect();
    want.sort_by(|a, b| b.0.total_cmp(&a.0));
    let pattern: Vec<f64> = shown[1].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(pattern.len(), want.len().min(8));
    for (s, (w, _)) in pattern.iter().zip(&want) {
        assert!((s - w).abs() < 1e-3, "attention {s} against {w}");
    }
    assert!(shown[2].as_u64().unwrap() > 0 && !shown[3].as_str().unwrap().is_empty(), "the largest QK terms: {shown}");
    // An edge's own panel: the heads that carry it.
    let edge = links.iter().find(|l| l["target"] == target && l["heads"].is_array()).unwrap();
    d.js(&format!(
        "document.querySelector('line.edge[data-source=\"{}\"][data-target=\"{}\"]').dispatchEvent(new MouseEvent('click'));",
        edge["source"].as_str().unwrap(),
        edge["target"].as_str().unwrap()
    ));
    let n = d.js("return document.querySelectorAll('#panel h4#heads + table a.head').length;");
    assert_eq!(n.as_u64().unwrap() as usize, edge["heads"].as_array().unwrap().len());
}
