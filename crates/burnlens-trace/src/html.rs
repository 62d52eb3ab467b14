//! `graph.html`: an offline, self-contained view of a pruned attribution graph. Nodes sit by
//! layer (rows: token embeddings at the bottom, then each layer's features and errors, the
//! logits on top) and position (columns); edges are drawn with a width by their weight
//! (blue positive, red negative). A click on a node lists its strongest inputs and outputs;
//! with `graph --qk`, each edge that crosses positions lists the heads that carry it, and a
//! click on a head shows its attention row at the edge's target and its largest QK terms.
//! The graph's JSON ([`crate::json`]) is embedded in the page; no network is needed.

use crate::json::GraphJson;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1em;color:#222}\
#wrap{display:flex;gap:1em;align-items:flex-start}#panel{min-width:22em;max-width:30em;font-size:13px}\
.ex{font-family:monospace;white-space:pre;margin:2px 0}.tok.centre{font-weight:bold;outline:1px solid #b45309}\
svg{border:1px solid #ddd;background:#fff}.node{cursor:pointer;stroke:#333;stroke-width:.6}\
.node.sel{stroke:#000;stroke-width:2.5}.edge{fill:none}.lab{font-size:10px;fill:#555}\
table{border-collapse:collapse}td{padding:1px 6px;border-bottom:1px solid #eee}";

/// The script that draws the embedded graph; it reads `#graph-data`.
const SCRIPT: &str = r##"
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
  const line = el('line', {x1: a[0], y1: a[1], x2: b[0], y2: b[1], class: 'edge', 'data-source': l.source, 'data-target': l.target,
    stroke: l.weight >= 0 ? 'rgba(30,90,200,.45)' : 'rgba(200,40,40,.45)', 'stroke-width': 0.5 + 4 * Math.abs(l.weight) / maxW}, edges);
  line.addEventListener('click', () => selectEdge(l));
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
const esc = s => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;');
const signed = w => '<span style="color:' + (w >= 0 ? '#1e5ac8' : '#c82828') + '">' + w.toPrecision(3) + '</span>';
// The heads carrying a link (graph --qk), each a link to its QK attributions at the target's position.
const headList = l => (l.heads || []).map(h => '<a href="#" class="head" data-layer="' + h.layer + '" data-head="' + h.head + '" data-query="' +
  byId[l.target].ctx_idx + '">L' + h.layer + '.H' + h.head + '</a> ' + signed(h.weight)).join(', ');
function rows(list, key) {
  return '<table>' + list.map(l => '<tr><td>' + esc(label(byId[l[key]])) + '</td><td style="text-align:right">' + signed(l.weight) + '</td><td class="heads">' + headList(l) + '</td></tr>').join('') + '</table>';
}
document.getElementById('panel').addEventListener('click', e => {
  const h = e.target.closest('a.head');
  if (!h) return;
  e.preventDefault();
  showHead(+h.dataset.layer, +h.dataset.head, +h.dataset.query);
});
function selectEdge(l) {
  document.getElementById('panel').innerHTML = '<h3>edge</h3><p>' + esc(label(byId[l.source])) + ' → ' + esc(label(byId[l.target])) + ': ' + signed(l.weight) + '</p>' +
    (l.heads ? '<h4 id="heads">carried by</h4><table>' + l.heads.map(h => '<tr><td>' + headList({heads: [h], target: l.target}) + '</td></tr>').join('') +
      '</table><p>other heads: ' + signed(l.heads_rest || 0) + '; through several heads: ' + signed(l.multi_hop || 0) + '</p>' : '<p>(no head loadings: same position, or the graph was written without --qk)</p>');
}
const qkLabel = n => n.kind === 'feature' ? 'feature L' + n.layer + ' #' + n.feature + ' @' + n.pos : n.kind === 'attention' ? 'L' + n.layer + '.H' + n.head + ' output @' + n.pos
  : n.kind === 'embedding' ? 'token ' + JSON.stringify(toks[n.pos]) + ' @' + n.pos : n.kind === 'error' ? 'error L' + n.layer + ' @' + n.pos : n.kind + (n.layer != null ? ' L' + n.layer : '') + ' @' + n.pos;
// Head `head` of layer `layer` at query `q`: its attention row and, for its most attended keys, the largest QK terms.
function showHead(layer, head, q) {
  const rs = (G.qk || []).filter(r => r.layer === layer && r.head === head && r.query === q).sort((a, b) => b.pattern - a.pattern);
  let html = '<div id="head"><h4>L' + layer + '.H' + head + ' at ' + esc(JSON.stringify(toks[q])) + ' @' + q + ': attention and why</h4><table>' +
    rs.slice(0, 8).map(r => '<tr><td>→ ' + esc(JSON.stringify(toks[r.key])) + ' @' + r.key + '</td><td>' + r.pattern.toFixed(3) + '</td><td>score ' + r.score.toPrecision(3) + '</td></tr>').join('') + '</table>';
  rs.slice(0, 3).forEach(r => {
    html += '<p>@' + r.key + ' (features × features ' + r.feature_feature.toPrecision(3) + ', with errors ' + r.error.toPrecision(3) + ', rest ' + r.other.toPrecision(3) + ')</p><table class="qk">' +
      r.terms.slice(0, 5).map(t => '<tr><td>' + esc(qkLabel(t.query_node)) + '</td><td>· ' + esc(qkLabel(t.key_node)) + '</td><td>' + signed(t.contribution) + '</td></tr>').join('') + '</table>';
  });
  const old = document.getElementById('head');
  if (old) old.remove();
  document.getElementById('panel').insertAdjacentHTML('beforeend', html + '</div>');
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
"##;

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
         Click a node for its strongest inputs and outputs, an edge or a head for the heads that carry it and why they attend.</p>\
         <div id=\"wrap\"><svg id=\"view\"></svg><div id=\"panel\"></div></div>\
         <script type=\"application/json\" id=\"graph-data\">{data}</script><script>{SCRIPT}</script></body></html>",
        title = escape(&m.prompt),
        n = graph.nodes.len(),
        e = graph.links.len(),
        thr = m.node_threshold.map_or("-".into(), |t| t.to_string()),
        scan = escape(&m.scan),
    )
}
