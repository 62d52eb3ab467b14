//! Views people open: a self-contained HTML attention viewer (no CDN, works offline) and
//! SVG figures (heatmaps, line plots) that embed in it or stand alone.

use std::fmt::Write as _;

use serde_json::json;

/// Escape text for HTML and SVG.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Attention patterns of one sequence for the viewer.
pub struct AttentionData<'a> {
    /// Token labels, one per position.
    pub tokens: &'a [String],
    /// Per layer, `[head, query, key]` row-major.
    pub patterns: &'a [Vec<f32>],
    pub n_heads: usize,
}

const VIEWER_CSS: &str = r#"
.bl-viewer{font-family:system-ui,sans-serif;font-size:13px}
.bl-layers button{margin:0 4px 4px 0;padding:3px 8px;border:1px solid #888;background:#fff;cursor:pointer}
.bl-layers button.on{background:#1f4e99;color:#fff}
.bl-grid{display:flex;flex-wrap:wrap;gap:10px}
.bl-head{border:1px solid #ccc;padding:4px;cursor:pointer;text-align:center}
.bl-head.selected{border-color:#1f4e99;box-shadow:0 0 0 2px #1f4e99}
.bl-big{margin-top:14px}
.bl-tip{position:fixed;pointer-events:none;background:#222;color:#fff;padding:4px 7px;border-radius:3px;font-size:12px;display:none;z-index:10;white-space:pre}
"#;

/// The viewer's script: draws one canvas per head, a tooltip on hover, an enlarged head with
/// token labels on click. Masked (future) cells are grey. Reads its data from the JSON block
/// `#bl-data`.
const VIEWER_JS: &str = r#"
(function(){
const D = JSON.parse(document.getElementById('bl-data').textContent);
const T = D.tokens.length, H = D.n_heads, L = D.patterns.length;
const SMALL = Math.max(2, Math.min(8, Math.floor(160 / T)));
const BIG = Math.max(8, Math.min(28, Math.floor(560 / T)));
const tip = document.getElementById('bl-tip');
let layer = 0, head = 0;
function val(l, h, q, k){ return D.patterns[l][(h * T + q) * T + k]; }
function color(v){ const c = Math.round(255 * (1 - Math.min(1, Math.max(0, v)))); return `rgb(${c},${c},255)`; }
function draw(canvas, l, h, cell, x0, y0){
  const g = canvas.getContext('2d');
  for (let q = 0; q < T; q++) for (let k = 0; k < T; k++) {
    g.fillStyle = k > q ? '#d9d9d9' : color(val(l, h, q, k));
    g.fillRect(x0 + k * cell, y0 + q * cell, cell, cell);
  }
}
function cellAt(canvas, ev, cell, x0, y0){
  const r = canvas.getBoundingClientRect();
  const k = Math.floor((ev.clientX - r.left - x0) / cell), q = Math.floor((ev.clientY - r.top - y0) / cell);
  return (q >= 0 && q < T && k >= 0 && k < T) ? [q, k] : null;
}
function showTip(ev, l, h, q, k){
  const masked = k > q;
  tip.textContent = `L${l}H${h}  destination ${q} ${JSON.stringify(D.tokens[q])}\nsource ${k} ${JSON.stringify(D.tokens[k])}\n` +
    (masked ? 'masked (future position)' : `attention ${val(l, h, q, k).toFixed(4)}`);
  tip.dataset.q = q; tip.dataset.k = k; tip.dataset.layer = l; tip.dataset.head = h;
  tip.dataset.value = masked ? '' : val(l, h, q, k).toFixed(4);
  tip.style.left = (ev.clientX + 12) + 'px'; tip.style.top = (ev.clientY + 12) + 'px'; tip.style.display = 'block';
}
function hideTip(){ tip.style.display = 'none'; }
function attach(canvas, getLH, cell, x0, y0){
  canvas.addEventListener('mousemove', ev => { const c = cellAt(canvas, ev, cell, x0, y0); const [l, h] = getLH(); if (c) showTip(ev, l, h, c[0], c[1]); else hideTip(); });
  canvas.addEventListener('mouseleave', hideTip);
}
const grid = document.getElementById('bl-grid'), big = document.getElementById('bl-big');
const labelW = 110, labelH = 110;
function renderBig(){
  hideTip();
  big.innerHTML = '';
  const title = document.createElement('div');
  title.textContent = `Layer ${layer}, head ${head}: rows are destinations (queries), columns are sources (keys)`;
  big.appendChild(title);
  const c = document.createElement('canvas');
  c.width = labelW + T * BIG + 4; c.height = labelH + T * BIG + 4; c.id = 'bl-big-canvas';
  c.dataset.cell = BIG; c.dataset.x0 = labelW; c.dataset.y0 = labelH;
  big.appendChild(c);
  const g = c.getContext('2d');
  g.font = Math.min(12, BIG) + 'px monospace'; g.fillStyle = '#000';
  for (let i = 0; i < T; i++) {
    const s = D.tokens[i].length > 12 ? D.tokens[i].slice(0, 11) + '…' : D.tokens[i];
    g.textAlign = 'right'; g.textBaseline = 'middle';
    g.fillText(s, labelW - 4, labelH + i * BIG + BIG / 2);
    g.save(); g.translate(labelW + i * BIG + BIG / 2, labelH - 4); g.rotate(-Math.PI / 2);
    g.textAlign = 'left'; g.fillText(s, 0, 0); g.restore();
  }
  draw(c, layer, head, BIG, labelW, labelH);
  attach(c, () => [layer, head], BIG, labelW, labelH);
}
function renderGrid(){
  grid.innerHTML = '';
  for (let h = 0; h < H; h++) {
    const box = document.createElement('div');
    box.className = 'bl-head' + (h === head ? ' selected' : '');
    box.dataset.head = h;
    const c = document.createElement('canvas');
    c.width = T * SMALL; c.height = T * SMALL; c.className = 'bl-small'; c.id = `bl-head-${h}`;
    c.dataset.cell = SMALL; c.dataset.x0 = 0; c.dataset.y0 = 0;
    draw(c, layer, h, SMALL, 0, 0);
    attach(c, () => [layer, h], SMALL, 0, 0);
    box.appendChild(c);
    const cap = document.createElement('div'); cap.textContent = `L${layer}H${h}`; box.appendChild(cap);
    box.addEventListener('click', () => { head = h; renderGrid(); renderBig(); });
    grid.appendChild(box);
  }
  document.getElementById('bl-rendered').textContent = `${H}`;
}
const layers = document.getElementById('bl-layers');
for (let l = 0; l < L; l++) {
  const b = document.createElement('button'); b.textContent = `layer ${l}`; b.id = `bl-layer-${l}`;
  b.addEventListener('click', () => { layer = l; [...layers.children].forEach((x, i) => x.className = i === l ? 'on' : ''); renderGrid(); renderBig(); });
  layers.appendChild(b);
}
layers.children[0].className = 'on';
renderGrid(); renderBig();
})();
"#;

/// The attention viewer as an HTML fragment (CSS, markup, data and script inline).
pub fn attention_viewer(data: &AttentionData) -> String {
    let payload = json!({
        "tokens": data.tokens,
        "n_heads": data.n_heads,
        "patterns": data.patterns.iter().map(|p| p.iter().map(|x| (x * 1e4).round() / 1e4).collect::<Vec<f32>>()).collect::<Vec<_>>(),
    });
    // `</` cannot end the JSON block early once escaped.
    let payload = payload.to_string().replace("</", "<\\/");
    format!(
        r#"<style>{VIEWER_CSS}</style>
<div class="bl-viewer" id="bl-viewer">
<div class="bl-layers" id="bl-layers"></div>
<div class="bl-grid" id="bl-grid"></div>
<div class="bl-big" id="bl-big"></div>
<div class="bl-tip" id="bl-tip"></div>
<span id="bl-rendered" hidden></span>
</div>
<script type="application/json" id="bl-data">{payload}</script>
<script>{VIEWER_JS}</script>"#
    )
}

/// A complete page around `body` sections.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:24px;max-width:1400px}}h2{{margin-top:32px}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right;font-size:12px}}</style>\
         </head><body><h1>{t}</h1>\n{body}\n</body></html>\n",
        t = esc(title)
    )
}

/// Heatmap of `values` (`rows × cols`, row-major) with labels, a diverging or sequential
/// colour scale between `vmin` and `vmax`.
pub fn heatmap_svg(title: &str, values: &[f32], rows: usize, cols: usize, row_labels: &[String], col_labels: &[String], vmin: f32, vmax: f32) -> String {
    let cell = (560.0 / cols.max(rows) as f32).clamp(4.0, 28.0);
    let (left, top) = (70.0, 80.0);
    // Wide enough for the title, tall enough for the legend (11 steps of 14 px).
    let (w, h) =
        ((left + cols as f32 * cell + 90.0).max(left + 7.0 * title.chars().count() as f32), (top + rows as f32 * cell + 20.0).max(top + 11.0 * 14.0 + 10.0));
    let mut s = String::new();
    let _ = write!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">"#);
    let _ = write!(s, r#"<text x="{left}" y="16" font-size="13">{}</text>"#, esc(title));
    let diverging = vmin < 0.0;
    let colour = |v: f32| {
        let t = ((v - vmin) / (vmax - vmin).max(1e-12)).clamp(0.0, 1.0);
        if diverging {
            let (r, g, b) = if t < 0.5 {
                let u = t * 2.0;
                (u, u, 1.0)
            } else {
                let u = (1.0 - t) * 2.0;
                (1.0, u, u)
            };
            format!("rgb({},{},{})", (r * 255.0) as u8, (g * 255.0) as u8, (b * 255.0) as u8)
        } else {
            let c = (255.0 * (1.0 - t)) as u8;
            format!("rgb({c},{c},255)")
        }
    };
    for r in 0..rows {
        for c in 0..cols {
            let v = values[r * cols + c];
            let _ = write!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{cell:.1}" height="{cell:.1}" fill="{}"><title>{} → {}: {v:.4}</title></rect>"#,
                left + c as f32 * cell,
                top + r as f32 * cell,
                colour(v),
                esc(&row_labels[r]),
                esc(&col_labels[c])
            );
        }
    }
    // Label every row and column while they fit (about 24 per side), every n-th beyond.
    let step = |n: usize| ((n as f32 / 24.0).ceil() as usize).max(1);
    for (i, label) in row_labels.iter().enumerate().step_by(step(rows)) {
        let _ = write!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
            left - 3.0,
            top + (i as f32 + 0.5) * cell,
            esc(label)
        );
    }
    for (i, label) in col_labels.iter().enumerate().step_by(step(cols)) {
        let x = left + (i as f32 + 0.5) * cell;
        let _ = write!(s, r#"<text transform="translate({x:.1},{}) rotate(-60)">{}</text>"#, top - 3.0, esc(label));
    }
    let lx = left + cols as f32 * cell + 15.0;
    for i in 0..=10 {
        let v = vmax - (vmax - vmin) * i as f32 / 10.0;
        let _ = write!(s, r#"<rect x="{lx}" y="{:.1}" width="12" height="{:.1}" fill="{}"/>"#, top + i as f32 * 14.0, 14.0, colour(v));
        if i % 5 == 0 {
            let _ = write!(s, r#"<text x="{}" y="{:.1}" dominant-baseline="middle">{v:.2}</text>"#, lx + 16.0, top + i as f32 * 14.0 + 7.0);
        }
    }
    s.push_str("</svg>");
    s
}

/// Line plot of one or more series against their index.
pub fn line_plot_svg(title: &str, x_label: &str, y_label: &str, series: &[(&str, &[f64])], vlines: &[f64]) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 360.0, 60.0, 130.0, 30.0, 45.0);
    let n = series.iter().map(|s| s.1.len()).max().unwrap_or(1).max(2);
    let all = || series.iter().flat_map(|s| s.1.iter().copied()).filter(|v| v.is_finite());
    let (mut lo, mut hi) = (all().fold(f64::INFINITY, f64::min), all().fold(f64::NEG_INFINITY, f64::max));
    if !(lo.is_finite() && hi > lo) {
        lo = 0.0;
        hi = 1.0;
    }
    let px = |i: f64| left + i / (n - 1) as f64 * (w - left - right);
    let py = |v: f64| top + (hi - v) / (hi - lo) * (h - top - bottom);
    let mut s = String::new();
    let _ = write!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#);
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/><text x="{left}" y="18" font-size="13">{}</text>"#, esc(title));
    let _ = write!(s, r##"<rect x="{left}" y="{top}" width="{}" height="{}" fill="none" stroke="#444"/>"##, w - left - right, h - top - bottom);
    for i in 0..=4 {
        let v = lo + (hi - lo) * i as f64 / 4.0;
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{y:.1}" text-anchor="end" dominant-baseline="middle">{v:.2}</text>"##,
            w - right,
            left - 4.0,
            y = py(v)
        );
    }
    for &x in vlines {
        let _ = write!(s, r##"<line x1="{x:.1}" x2="{x:.1}" y1="{top}" y2="{}" stroke="#999" stroke-dasharray="4 3"/>"##, h - bottom, x = px(x));
    }
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    for (i, (name, ys)) in series.iter().enumerate() {
        let pts: Vec<String> = ys.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(j, &v)| format!("{:.1},{:.1}", px(j as f64), py(v))).collect();
        let c = colours[i % colours.len()];
        let _ = write!(s, r#"<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{}"/>"#, pts.join(" "));
        let _ = write!(s, r#"<text x="{}" y="{}" fill="{c}">{}</text>"#, w - right + 8.0, top + 14.0 + 16.0 * i as f64, esc(name));
    }
    let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, (left + w - right) / 2.0, h - 10.0, esc(x_label));
    let _ = write!(s, r#"<text transform="translate(14,{}) rotate(-90)" text-anchor="middle">{}</text>"#, (top + h - bottom) / 2.0, esc(y_label));
    s.push_str("</svg>");
    s
}

/// The text of a sequence with each token's background coloured by a value (per-token
/// log-probability, loss difference, attribution, feature activation): blue for low or
/// negative, red for high or positive, white in the middle; the value is in the tooltip and
/// in `data-value`. `None` (no value, e.g. the last position's next-token log-prob) stays
/// uncoloured. With `diverging`, the scale is symmetric around 0; otherwise it runs from the
/// smallest to the largest value.
pub fn coloured_tokens(title: &str, tokens: &[String], values: &[Option<f64>], diverging: bool) -> String {
    let finite = || values.iter().flatten().copied().filter(|v| v.is_finite());
    let (lo, hi) = (finite().fold(f64::INFINITY, f64::min), finite().fold(f64::NEG_INFINITY, f64::max));
    let (lo, hi) = match (lo.is_finite(), diverging) {
        (false, _) => (0.0, 1.0),
        (true, true) => {
            let m = lo.abs().max(hi.abs()).max(1e-12);
            (-m, m)
        }
        (true, false) if hi > lo => (lo, hi),
        (true, false) => (lo - 1.0, hi + 1.0),
    };
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<div class="bl-tokens"><div class="bl-tokens-title">{}</div><div class="bl-tokens-text" style="font-family:monospace;font-size:14px;line-height:1.9;white-space:pre-wrap">"#,
        esc(title)
    );
    for (i, tok) in tokens.iter().enumerate() {
        let v = values.get(i).copied().flatten();
        let (bg, tip) = match v {
            Some(v) if v.is_finite() => {
                let t = ((v - lo) / (hi - lo)).clamp(0.0, 1.0);
                let (r, g, b) = if t < 0.5 {
                    let u = t * 2.0;
                    (u, u, 1.0)
                } else {
                    let u = (1.0 - t) * 2.0;
                    (1.0, u, u)
                };
                (format!("rgb({},{},{})", (r * 255.0) as u8, (g * 255.0) as u8, (b * 255.0) as u8), format!("{v:.4}"))
            }
            _ => ("transparent".to_string(), "n/a".to_string()),
        };
        let shown = if tok.is_empty() { "∅".to_string() } else { tok.replace('\n', "⏎\n") };
        let _ = write!(
            s,
            r#"<span class="bl-tok" data-pos="{i}" data-value="{tip}" title="{i} {}: {tip}" style="background:{bg};border:1px solid #ddd;padding:1px 0">{}</span>"#,
            esc(&format!("{tok:?}")),
            esc(&shown)
        );
    }
    let _ = write!(s, r#"</div><div style="font-size:11px;color:#555">scale {lo:.3} (blue) … {hi:.3} (red)</div></div>"#);
    s
}

/// Scatter plot of `(x, y)` points with labels in tooltips and the line y = x.
pub fn scatter_svg(title: &str, x_label: &str, y_label: &str, points: &[(f64, f64)], labels: &[String]) -> String {
    let (w, h, m) = (460.0, 420.0, 55.0);
    let all = points.iter().flat_map(|p| [p.0, p.1]).filter(|v| v.is_finite());
    let (mut lo, mut hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if !(lo.is_finite() && hi > lo) {
        lo = -1.0;
        hi = 1.0;
    }
    let pad = (hi - lo) * 0.05;
    let (lo, hi) = (lo - pad, hi + pad);
    let px = |v: f64| m + (v - lo) / (hi - lo) * (w - 2.0 * m);
    let py = |v: f64| h - m - (v - lo) / (hi - lo) * (h - 2.0 * m);
    let mut s = String::new();
    let _ = write!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#);
    let _ = write!(s, r##"<rect width="{w}" height="{h}" fill="white"/><text x="{m}" y="18" font-size="13">{}</text>"##, esc(title));
    let _ = write!(s, r##"<rect x="{m}" y="{m}" width="{}" height="{}" fill="none" stroke="#444"/>"##, w - 2.0 * m, h - 2.0 * m);
    let _ = write!(s, r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#bbb" stroke-dasharray="4 3"/>"##, px(lo), py(lo), px(hi), py(hi));
    for i in 0..=4 {
        let v = lo + (hi - lo) * i as f64 / 4.0;
        let _ = write!(s, r#"<text x="{:.1}" y="{}" text-anchor="middle">{v:.2}</text>"#, px(v), h - m + 14.0);
        let _ = write!(s, r#"<text x="{}" y="{:.1}" text-anchor="end" dominant-baseline="middle">{v:.2}</text>"#, m - 4.0, py(v));
    }
    for (i, &(x, y)) in points.iter().enumerate() {
        if x.is_finite() && y.is_finite() {
            let label = labels.get(i).map_or(String::new(), |l| esc(l));
            let _ = write!(
                s,
                r##"<circle class="bl-point" cx="{:.1}" cy="{:.1}" r="3.5" fill="#1f77b4" fill-opacity="0.7"><title>{label}: {x:.4}, {y:.4}</title></circle>"##,
                px(x),
                py(y)
            );
        }
    }
    let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, w / 2.0, h - 12.0, esc(x_label));
    let _ = write!(s, r#"<text transform="translate(14,{}) rotate(-90)" text-anchor="middle">{}</text>"#, h / 2.0, esc(y_label));
    s.push_str("</svg>");
    s
}
