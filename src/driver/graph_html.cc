// Model::graph_html (`kiln info MODEL --graph -o graph.html`): the optimized
// graph as one self-contained page. The graph is embedded as JSON; the
// page's script lays it out in layers (each node one below its deepest
// producer), draws it as SVG with every fused kernel in its own colour, and
// shows a node's kernel choice when it is clicked. Nothing is loaded from
// elsewhere.
#include <map>
#include <sstream>
#include <string>

#include "driver/compile.h"
#include "support/json.h"

namespace kiln {

namespace {

const char kPage[] = R"KILNHTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Kiln graph</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }
#view { flex: 1; overflow: auto; background: #fafafa; }
#side { width: 380px; overflow: auto; border-left: 1px solid #ccc; padding: 8px 12px; }
.node rect { stroke: #333; stroke-width: 1; rx: 4; cursor: pointer; }
.node.selected rect { stroke-width: 3; }
.node text { font-size: 11px; pointer-events: none; }
.io rect { fill: #fff; stroke-dasharray: 3 2; }
.edge { stroke: #999; fill: none; }
table { border-collapse: collapse; font-size: 12px; }
td, th { border-bottom: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
code { font-size: 11px; }
</style>
</head>
<body>
<div id="view"><svg id="graph" xmlns="http://www.w3.org/2000/svg"></svg></div>
<div id="side">
<h3 id="title"></h3>
<p id="summary"></p>
<div id="detail"><p>Click a node: its op, values and the kernel it runs in.</p></div>
<h4>Kernels</h4>
<table id="kernels"><thead><tr><th>kernel</th><th>nodes</th><th>implementation</th><th>by</th></tr></thead><tbody></tbody></table>
</div>
<script id="kiln-graph" type="application/json">@DATA@</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("kiln-graph").textContent);
const SVG = "http://www.w3.org/2000/svg";
const W = 190, H = 38, GAP_X = 24, GAP_Y = 34;

function el(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function colour(run) {
  if (!run.startsWith("kiln_k")) return run === "dead" ? "#eee" : "#ddd";
  let h = 0;
  for (const c of run) h = (h * 31 + c.charCodeAt(0)) % 360;
  return "hsl(" + h + ", 65%, 80%)";
}
function text(s) { const d = document.createElement("span"); d.textContent = s; return d.innerHTML; }

// Boxes: graph inputs, nodes, graph outputs. Layer: one below the deepest producer.
const boxes = [], byValue = {}, layerOf = {};
data.inputs.forEach((v, i) => { const b = {id: "in" + i, label: v.name, sub: v.type, io: true, layer: 0}; boxes.push(b); byValue[v.name] = b; });
data.nodes.forEach(n => {
  let layer = 1;
  n.inputs.forEach(v => { if (byValue[v]) layer = Math.max(layer, byValue[v].layer + 1); });
  const b = {id: "n" + n.id, node: n, label: n.op, sub: n.name, layer: layer, run: n.run};
  boxes.push(b);
  n.outputs.forEach(o => { byValue[o.name] = b; });
});
let depth = 0;
boxes.forEach(b => { depth = Math.max(depth, b.layer); });
data.outputs.forEach((v, i) => {
  const src = byValue[v.name];
  boxes.push({id: "out" + i, label: v.name, sub: v.type, io: true, layer: (src ? src.layer : depth) + 1, from: src});
});
const rows = {};
boxes.forEach(b => { (rows[b.layer] = rows[b.layer] || []).push(b); });
let width = 0, height = 0;
Object.keys(rows).forEach(l => {
  rows[l].forEach((b, i) => { b.x = 10 + i * (W + GAP_X); b.y = 10 + Number(l) * (H + GAP_Y); });
  width = Math.max(width, 10 + rows[l].length * (W + GAP_X));
  height = Math.max(height, 10 + (Number(l) + 1) * (H + GAP_Y));
});
const svg = document.getElementById("graph");
svg.setAttribute("width", width);
svg.setAttribute("height", height);
const edges = el("g", {}, svg);
function edge(a, b) {
  const x1 = a.x + W / 2, y1 = a.y + H, x2 = b.x + W / 2, y2 = b.y;
  el("path", {class: "edge", d: "M" + x1 + "," + y1 + " C" + x1 + "," + (y1 + GAP_Y / 2) + " " + x2 + "," + (y2 - GAP_Y / 2) + " " + x2 + "," + y2}, edges);
}
boxes.forEach(b => {
  if (b.node) b.node.inputs.forEach(v => { if (byValue[v] && byValue[v] !== b) edge(byValue[v], b); });
  if (b.from) edge(b.from, b);
});
let selected = null;
boxes.forEach(b => {
  const g = el("g", {class: "node" + (b.io ? " io" : ""), "data-name": b.node ? b.node.name : b.label, transform: "translate(" + b.x + "," + b.y + ")"}, svg);
  el("rect", {width: W, height: H, fill: b.io ? "#fff" : colour(b.run)}, g);
  el("text", {x: 6, y: 15, "font-weight": "bold"}, g).textContent = b.label.length > 28 ? b.label.slice(0, 27) + "\u2026" : b.label;
  el("text", {x: 6, y: 30}, g).textContent = b.sub.length > 32 ? b.sub.slice(0, 31) + "\u2026" : b.sub;
  if (b.node) g.addEventListener("click", () => {
    if (selected) selected.classList.remove("selected");
    selected = g; g.classList.add("selected");
    show(b.node);
  });
});

const kernelsByName = {};
data.kernels.forEach(k => { kernelsByName[k.kernel] = k; });
function show(n) {
  const k = kernelsByName[n.run];
  let h = "<h4>" + text(n.op) + " <code>" + text(n.name) + "</code></h4><table>";
  h += "<tr><th>runs as</th><td>" + text(n.run) + "</td></tr>";
  n.inputs.forEach((v, i) => { h += "<tr><th>input " + i + "</th><td><code>" + text(v) + "</code></td></tr>"; });
  n.outputs.forEach((o, i) => { h += "<tr><th>output " + i + "</th><td><code>" + text(o.name) + "</code> " + text(o.type) + "</td></tr>"; });
  if (k) {
    h += "<tr><th>kernel node</th><td>" + text(k.node) + "</td></tr>";
    h += "<tr><th>implementation</th><td>" + text(k.impl) + (k.knobs ? " (" + text(k.knobs) + ")" : "") + "</td></tr>";
    h += "<tr><th>chosen by</th><td>" + text(k.source) + (k.why ? ": " + text(k.why) : "") + "</td></tr>";
    if (k.workload) h += "<tr><th>workload</th><td><code>" + text(k.workload.slice(0, 12)) + "</code></td></tr>";
  }
  document.getElementById("detail").innerHTML = h + "</table>";
}

const count = {};
data.nodes.forEach(n => { count[n.run] = (count[n.run] || 0) + 1; });
const body = document.querySelector("#kernels tbody");
data.kernels.forEach(k => {
  const tr = document.createElement("tr");
  tr.innerHTML = "<td><code>" + text(k.kernel) + "</code></td><td>" + (count[k.kernel] || 0) + "</td><td>" + text(k.impl) + (k.knobs ? " <code>" + text(k.knobs) + "</code>" : "") + "</td><td>" + text(k.source) + "</td>";
  tr.style.background = colour(k.kernel);
  body.appendChild(tr);
});
document.getElementById("title").textContent = data.model;
document.getElementById("summary").textContent = data.nodes.length + " nodes, " + data.kernels.length + " kernels, " +
  data.inputs.length + " inputs, " + data.outputs.length + " outputs";
document.body.setAttribute("data-rendered", String(svg.querySelectorAll("g.node").length));
</script>
</body>
</html>
)KILNHTML";

// `s` escaped for a <script> element's JSON (no "</" that would end it).
std::string script_safe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '<') out += "\\u003c";
    else out += json[i];
  }
  return out;
}

}  // namespace

namespace driver {

std::string graph_html(const CompiledProgram& c) {
  const Graph& g = *c.graph;
  std::ostringstream os;
  os << "{\"model\": " << json_quote(g.source) << ", \"inputs\": [";
  bool first = true;
  for (const Value* v : g.inputs()) {
    if (v->is_constant()) continue;
    os << (first ? "" : ", ") << "{\"name\": " << json_quote(v->name()) << ", \"type\": " << json_quote(v->type().to_string())
       << "}";
    first = false;
  }
  os << "], \"outputs\": [";
  first = true;
  for (const Value* v : g.outputs()) {
    os << (first ? "" : ", ") << "{\"name\": " << json_quote(v->name()) << ", \"type\": " << json_quote(v->type().to_string())
       << "}";
    first = false;
  }
  os << "], \"nodes\": [";
  int id = 0;
  for (const Node* n : g.nodes()) {
    auto run = c.node_runs.find(n);
    os << (id ? ",\n" : "") << "{\"id\": " << id << ", \"name\": " << json_quote(n->name())
       << ", \"op\": " << json_quote(n->domain().empty() ? n->op_type() : n->domain() + ":" + n->op_type())
       << ", \"run\": " << json_quote(run == c.node_runs.end() ? "dead" : run->second) << ", \"inputs\": [";
    bool f = true;
    for (const Value* v : n->inputs()) {
      if (v == nullptr || v->is_constant()) continue;
      os << (f ? "" : ", ") << json_quote(v->name());
      f = false;
    }
    os << "], \"outputs\": [";
    f = true;
    for (const Value* v : n->outputs()) {
      os << (f ? "" : ", ") << "{\"name\": " << json_quote(v->name()) << ", \"type\": " << json_quote(v->type().to_string())
         << "}";
      f = false;
    }
    os << "]}";
    ++id;
  }
  os << "], \"kernels\": [";
  first = true;
  for (const driver::KernelChoiceInfo& k : c.kernel_choices) {
    os << (first ? "" : ",\n") << "{\"kernel\": " << json_quote(k.kernel) << ", \"node\": " << json_quote(k.node)
       << ", \"impl\": " << json_quote(k.impl) << ", \"knobs\": " << json_quote(k.knobs)
       << ", \"source\": " << json_quote(k.source) << ", \"why\": " << json_quote(k.why)
       << ", \"workload\": " << json_quote(k.workload) << "}";
    first = false;
  }
  os << "]}";
  std::string page = kPage;
  const std::string marker = "@DATA@";
  page.replace(page.find(marker), marker.size(), script_safe(os.str()));
  return page;
}

}  // namespace driver
}  // namespace kiln
