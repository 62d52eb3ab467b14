//! `graph.html`: an offline, self-contained view of a pruned attribution graph. Nodes sit by
//! layer (rows: token embeddings at the bottom, then each layer's features and errors, the
//! logits on top) and position (columns); edges are drawn with a width by their weight
//! (blue positive, red negative). A click on a node lists its strongest inputs and outputs.
//! The graph's JSON ([`crate::json`]) is embedded in the page; no network is needed.

use crate::json::GraphJson;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1em;color:#222}\
#wrap{display:flex;gap:1em;align-items:flex-start}#panel{min-width:22em;max-width:30em;font-size:13px}\
.ex{font-family:monospace;white-space:pre;margin:2px 0}.tok.centre{font-weight:bold;outline:1px solid #b45309}\
svg{border:1px solid #ddd;background:#fff}.node{cursor:pointer;stroke:#333;stroke-width:.6}\
.node.sel{stroke:#000;stroke-width:2.5}.edge{fill:none}.lab{font-size:10px;fill:#555}\
table{border-collapse:collapse}td{padding:1px 6px;border-bottom:1px solid #eee}";

/// The script that draws the embedded graph; it reads `#graph-data`.
const SCRIPT: &str = r#"
const G = JSON.parse(document.getElementById('graph-data').textContent);
const kinds = {'cross layer transcoder': '#f4a261', 'mlp reconstruction error': '#adb5bd', 'embedding': '#8ecae6', 'logit': '#90be6d'};
const toks = G.metadata.prompt_tokens, nPos = toks.length;
// Embeddings at the bottom, layer l's features and errors in row l + 1, logits (their layer is
// n_layers + 1) on top.
const layerRow = n => n.layer === 'E' ? 0 : n.feature_type === 'logit' ? +n.layer : +n.layer + 1;
const nRows = Math.max(...G.nodes.map(layerRow)) + 1;
const colW = 110, rowH = 70, padL = 60, padB = 40, W = padL + nPos * colW + 20, H = nRows * rowH + padB + 20;
const byCell = {};
G.nodes.forEach(n => { const k = layerRow(n) + ',' + n.ctx_idx; (byCell[k] = byCell[k] || []).push(n); });
const pos = {};
Object.values(byCell).forEach(list => list.forEach((n, i) => {
  const spread = Math.min(colW - 20, list.length * 12), x0 = padL + n.ctx_idx * colW + colW / 2 - spread / 2;
  pos[n.node_id] = [list.length === 1 ? padL + n.ctx_idx * colW + colW / 2 : x0 + spread * i / (list.length - 1), H - padB - layerRow(n) * rowH - rowH / 2];
}));
const svgNS = 'http://www.w3.org/2000/svg';
const svg = document.getElementById('view');
svg.setAttribute('width', W); svg.setAttribute('height', H);
const el = (tag, attrs, parent) => { const e = document.createElementNS(svgNS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); parent.appendChild(e); return e; };
for (let r = 0; r < nRows; r++) {
  const t = el('text', {x: 4, y: H - padB - r * rowH - rowH / 2 + 3, class: 'lab'}, svg);
  t.textContent = r === 0 ? 'emb' : r === nRows - 1 && G.nodes.some(n => n.feature_type === 'logit') ? 'logit' : 'L' + (r - 1);
}
toks.forEach((tk, p) => { const t = el('text', {x: padL + p * colW + colW / 2, y: H - 12, 'text-anchor': 'middle', class: 'lab tok'}, svg); t.textContent = tk; });
const maxW = Math.max(1e-12, ...G.links.map(l => Math.abs(l.weight)));
const edges = el('g', {}, svg);
G.links.forEach(l => {
  const a = pos[l.source], b = pos[l.target];
  if (!a || !b) return;
  el('line', {x1: a[0], y1: a[1], x2: b[0], y2: b[1], class: 'edge', 'data-source': l.source, 'data-target': l.target,
    stroke: l.weight >= 0 ? 'rgba(30,90,200,.45)' : 'rgba(200,40,40,.45)', 'stroke-width': 0.5 + 4 * Math.abs(l.weight) / maxW}, edges);
});
const label = n => n.feature_type === 'logit' ? n.clerp : n.feature_type === 'embedding' ? 'token ' + JSON.stringify(toks[n.ctx_idx]) + ' @' + n.ctx_idx
  : n.feature_type === 'mlp reconstruction error' ? 'error L' + n.layer + ' @' + n.ctx_idx : 'feature L' + n.layer + ' #' + n.node_id.split('_')[1] + ' @' + n.ctx_idx;
const byId = {}; G.nodes.forEach(n => byId[n.node_id] = n);
const nodes = el('g', {}, svg);
G.nodes.forEach(n => {
  const [x, y] = pos[n.node_id];
  const c = el('circle', {cx: x, cy: y, r: n.feature_type === 'logit' ? 7 : 5, fill: kinds[n.feature_type] || '#ccc', class: 'node', 'data-id': n.node_id}, nodes);
  el('title', {}, c).textContent = label(n);
  c.addEventListener('click', () => select(n.node_id));
});
function rows(list, key) {
  return '<table>' + list.map(l => '<tr><td>' + label(byId[l[key]]).replace(/</g, '&lt;') + '</td><td style="text-align:right;color:' + (l.weight >= 0 ? '#1e5ac8' : '#c82828') + '">' + l.weight.toPrecision(3) + '</td></tr>').join('') + '</table>';
}
function select(id) {
  document.querySelectorAll('.node').forEach(c => c.classList.toggle('sel', c.dataset.id === id));
  const top = (list) => list.sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, 10);
  const inputs = top(G.links.filter(l => l.target === id)), outputs = top(G.links.filter(l => l.source === id));
  const n = byId[id];
  document.getElementById('panel').innerHTML = '<h3>' + label(n).replace(/</g, '&lt;') + '</h3>' +
    (n.activation != null ? '<p>activation ' + n.activation.toPrecision(4) + '</p>' : '') +
    (n.influence != null ? '<p>cumulative influence ' + n.influence.toPrecision(4) + '</p>' : '') +
    '<h4 id="inputs">strongest inputs (' + inputs.length + ')</h4>' + rows(inputs, 'source') +
    '<h4 id="outputs">strongest outputs (' + outputs.length + ')</h4>' + rows(outputs, 'target');
  if (n.dashboard) showDashboard(n.dashboard);
}
function showDashboard(d) {
  const box = document.createElement('div'); box.id = 'dashboard';
  const h = document.createElement('h4'); h.textContent = 'top activations (max ' + d.max.toPrecision(4) + ', density ' + (100 * d.density).toPrecision(3) + '%)'; box.appendChild(h);
  d.examples.forEach(e => {
    const div = document.createElement('div'); div.className = 'ex';
    e.tokens.forEach((t, i) => { const s = document.createElement('span'); s.textContent = t; s.className = 'tok' + (i === e.centre ? ' centre' : '');
      if (e.acts[i] > 0) s.style.background = 'rgba(245,158,11,' + Math.min(1, e.acts[i] / (d.max || 1)).toFixed(3) + ')'; s.title = e.acts[i].toFixed(4); div.appendChild(s); });
    box.appendChild(div);
  });
  for (const [k, label] of [['promotes', 'promotes'], ['suppresses', 'suppresses']]) {
    const p = document.createElement('p'); p.className = k; p.textContent = label + ': ' + d[k].join(' · '); box.appendChild(p);
  }
  document.getElementById('panel').appendChild(box);
}
"#;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The page for `graph`.
pub fn graph_html(graph: &GraphJson) -> String {
    // `</` cannot appear inside a script element.
    let data = serde_json::to_string(graph).expect("json").replace("</", "<\\/");
    let m = &graph.metadata;
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title><style>{STYLE}</style></head><body>\
         <h2>Attribution graph: {title}</h2><p>{n} nodes, {e} edges (pruned at node threshold {thr}); transcoders {scan}. \
         Click a node for its strongest inputs and outputs.</p>\
         <div id=\"wrap\"><svg id=\"view\"></svg><div id=\"panel\"></div></div>\
         <script type=\"application/json\" id=\"graph-data\">{data}</script><script>{SCRIPT}</script></body></html>",
        title = escape(&m.prompt),
        n = graph.nodes.len(),
        e = graph.links.len(),
        thr = m.node_threshold.map_or("-".into(), |t| t.to_string()),
        scan = escape(&m.scan),
    )
}
