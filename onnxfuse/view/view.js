// The fusion plan page: draws the layouts dot computed (see layout.py) and lets one select, search,
// zoom, pan, fold groups and switch between the original graph and the fused model.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const DATA = JSON.parse(document.getElementById("plan-data").textContent);
  const dump = DATA.dump;
  const graph = dump.graph;
  const groups = new Map(dump.groups.map((g) => [g.name, g]));
  const groupOrder = new Map(dump.groups.map((g, i) => [g.name, i]));
  const nodes = new Map(graph.nodes.map((n) => [n.id, n]));
  const hasReport = "report" in dump;

  const svg = document.getElementById("canvas");
  const viewport = document.getElementById("viewport");
  const panel = document.getElementById("panel");
  const search = document.getElementById("search");
  const searchCount = document.getElementById("search-count");
  const collapse = document.getElementById("collapse");

  const state = {
    graph: "original",
    collapse: DATA.start_collapsed,
    folded: new Set(), // groups folded into one box in the expanded plan
    selected: null, // {kind: "node" | "group", id}
    matches: [],
    matchAt: -1,
    vb: { x: 0, y: 0, w: 1, h: 1 },
  };
  let drawn = { boxes: new Map(), clusters: new Map(), edges: [] };

  // ---- colours: one hue per group, spread by the golden angle
  function hue(group) { return (groupOrder.get(group) * 137.508) % 360; }
  function groupFill(group, light) { return `hsl(${hue(group)}, 65%, ${light}%)`; }
  function groupStroke(group) { return `hsl(${hue(group)}, 50%, 38%)`; }

  function el(tag, attrs, parent) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }
  function html(tag, text, parent, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    if (parent) parent.appendChild(e);
    return e;
  }

  function viewName() {
    if (state.graph === "fused") return "fused";
    return state.collapse ? "collapsed" : "plan";
  }

  // ---- drawing one layout
  function draw() {
    const layout = DATA.layouts[viewName()];
    viewport.textContent = "";
    drawn = { boxes: new Map(), clusters: new Map(), edges: [] };
    const clusterLayer = el("g", { class: "clusters" }, viewport);
    const edgeLayer = el("g", { class: "edges" }, viewport);
    const boxLayer = el("g", { class: "boxes" }, viewport);
    const clusterIds = Object.keys(layout.clusters).sort((a, b) => (a.startsWith("body:") ? 0 : 1) - (b.startsWith("body:") ? 0 : 1));
    for (const id of clusterIds) drawCluster(clusterLayer, id, layout.clusters[id]);
    for (const [from, to, path, arrow] of layout.edges) {
      const d = `${path} L${arrow[2]},${arrow[3]}`;
      const e = el("path", { class: "edge", d, "marker-end": "url(#arrow)" }, edgeLayer);
      drawn.edges.push({ from, to, el: e });
    }
    for (const [id, box] of Object.entries(layout.boxes)) drawBox(boxLayer, id, box);
    for (const group of state.folded) foldGroup(group, true);
    applyMarks();
  }

  function drawCluster(parent, id, [x, y, w, h]) {
    const isGroup = id.startsWith("group:");
    const name = id.slice(id.indexOf(":") + 1);
    const g = el("g", { class: `cluster ${isGroup ? "group" : "body"}` }, parent);
    if (isGroup) {
      g.dataset.group = name;
      const rect = el("rect", { x, y, width: w, height: h, rx: 4, fill: groupFill(name, 90), stroke: groupStroke(name) }, g);
      if (groups.get(name).status === "fallback") { g.classList.add("fell-back"); rect.setAttribute("stroke-dasharray", "6 3"); }
      const label = el("text", { x: x + 4, y: y + 11, class: "label" }, g);
      label.textContent = name;
      const fold = el("g", { class: "fold", transform: `translate(${x + w - 13},${y + 2})` }, g);
      el("rect", { width: 11, height: 11, rx: 2 }, fold);
      el("text", { x: 2.5, y: 9 }, fold).textContent = "−";
      el("title", {}, fold).textContent = "fold this group into one box";
      fold.addEventListener("click", (ev) => { ev.stopPropagation(); if (!wasDrag()) toggleFold(name); });
      g.addEventListener("click", (ev) => { ev.stopPropagation(); if (!wasDrag()) select({ kind: "group", id: name }); });
      drawn.clusters.set(name, { el: g, rect: [x, y, w, h] });
    } else {
      el("rect", { x, y, width: w, height: h, rx: 4 }, g);
      el("text", { x: x + 4, y: y + 11 }, g).textContent = `body ${name}`;
    }
  }

  function drawBox(parent, id, [cx, cy, w, h, kind, lines]) {
    const g = el("g", { class: `box ${kind}` }, parent);
    g.dataset.id = id;
    const node = nodes.get(id);
    const group = id.startsWith("group:") ? id.slice(6) : node && node.group;
    if (group) g.dataset.group = group;
    const rect = el("rect", { x: cx - w / 2, y: cy - h / 2, width: w, height: h, rx: kind === "input" || kind === "output" ? h / 2 : 3 }, g);
    // inline style: it must win over the stylesheet's default box colours
    if (kind === "group" || kind === "kernel") {
      rect.style.fill = groupFill(group, 78);
      rect.style.stroke = groupStroke(group);
      if (groups.get(group).status === "fallback") { g.classList.add("fell-back"); rect.style.strokeDasharray = "6 3"; }
    } else if (kind === "fallback") {
      rect.style.fill = "#eceef2";
      rect.style.stroke = groupStroke(group);
    } else if (group) {
      rect.style.fill = groupFill(group, 97);
      rect.style.stroke = groupStroke(group);
    }
    const top = cy - (lines.length - 1) * 6.5 + 3.5;
    lines.forEach((line, i) => {
      const t = el("text", { x: cx, y: top + i * 13, "text-anchor": "middle", class: i === 0 ? "title" : "" }, g);
      t.textContent = line;
    });
    const title = el("title", {}, g);
    if (kind === "unfused") {
      el("circle", { cx: cx + w / 2 - 1, cy: cy - h / 2 + 1, r: 5, class: "badge" }, g);
      el("text", { x: cx + w / 2 - 1, y: cy - h / 2 + 4, "text-anchor": "middle", class: "badge-text" }, g).textContent = "!";
      g.dataset.reason = node.unfused_reason;
      title.textContent = `${node.op_type} ${node.name}: unfused: ${node.unfused_reason}`;
    } else if (node) {
      title.textContent = `${node.op_type} ${node.name}${group ? " (" + group + ")" : ""}`;
    } else if (group) {
      title.textContent = `${group}: ${groups.get(group).size} ops`;
    } else {
      title.textContent = id;
    }
    g.addEventListener("click", (ev) => {
      ev.stopPropagation();
      if (wasDrag()) return;
      if (kind === "group" || kind === "kernel") select({ kind: "group", id: group });
      else if (node) select({ kind: "node", id });
    });
    drawn.boxes.set(id, { el: g, rect: [cx - w / 2, cy - h / 2, w, h] });
  }

  // ---- folding a group of the expanded plan into one box over its cluster
  function toggleFold(group) {
    if (state.folded.has(group)) state.folded.delete(group); else state.folded.add(group);
    draw();
  }

  function foldGroup(group) {
    const cluster = drawn.clusters.get(group);
    if (!cluster) return;
    const [x, y, w, h] = cluster.rect;
    const g = groups.get(group);
    cluster.el.querySelector("rect").setAttribute("fill", groupFill(group, 78));
    cluster.el.querySelector(".fold text").textContent = "+";
    cluster.el.querySelector(".fold title").textContent = "unfold this group";
    el("text", { x: x + w / 2, y: y + h / 2, "text-anchor": "middle" }, cluster.el).textContent = `${g.size} ops: ${opsSummary(g.op_types, 2)}`;
    for (const [id, box] of drawn.boxes) {
      const n = nodes.get(id);
      if (n && n.group === group) box.el.classList.add("hidden");
    }
    for (const e of drawn.edges) {
      const a = nodes.get(e.from), b = nodes.get(e.to);
      if (a && b && a.group === group && b.group === group) e.el.classList.add("hidden");
    }
  }

  // ---- where an element of the model is drawn in the current view
  function drawnFor(sel) {
    if (!sel) return null;
    if (sel.kind === "group") return drawn.clusters.get(sel.id) || drawn.boxes.get(`group:${sel.id}`) || null;
    const direct = drawn.boxes.get(sel.id);
    if (direct && !direct.el.classList.contains("hidden")) return direct;
    const group = nodes.get(sel.id).group;
    return group ? drawnFor({ kind: "group", id: group }) : direct || null;
  }

  function applyMarks() {
    for (const e of viewport.querySelectorAll(".selected, .match")) e.classList.remove("selected", "match");
    for (const e of drawn.edges) e.el.classList.remove("lit");
    for (const m of state.matches) {
      const d = drawnFor(m);
      if (d) d.el.classList.add("match");
    }
    const d = drawnFor(state.selected);
    if (d) d.el.classList.add("selected");
    if (state.selected && state.selected.kind === "node") {
      for (const e of drawn.edges) if (e.from === state.selected.id || e.to === state.selected.id) e.el.classList.add("lit");
    }
  }

  // ---- selection and the side panel
  function select(sel) {
    state.selected = sel;
    applyMarks();
    showPanel();
  }

  function link(text, sel, parent) {
    const a = html("a", text, parent);
    a.addEventListener("click", () => { select(sel); centerOn(sel); });
    return a;
  }

  function facts(rows, parent) {
    const table = html("table", null, parent);
    for (const [k, v] of rows) {
      if (v === undefined || v === null || v === "") continue;
      const tr = html("tr", null, table);
      html("th", k, tr);
      const td = html("td", null, tr, "fact");
      if (v instanceof Node) td.appendChild(v); else td.textContent = v;
    }
    return table;
  }

  function valueText(name, scope) {
    if (!name) return "(omitted)";
    const v = graph.values[scope ? `${scope}/${name}` : name] || graph.values[name];
    if (!v) return name;
    const shape = v.shape ? `[${v.shape.map((d) => (d === null ? "?" : d)).join(", ")}]` : "[?]";
    return `${name}: ${v.dtype || "?"} ${shape}${v.constant ? " (constant)" : ""}`;
  }

  function opsSummary(ops, limit) {
    const counts = new Map();
    for (const op of ops) counts.set(op, (counts.get(op) || 0) + 1);
    const parts = [...counts].sort((a, b) => b[1] - a[1]).map(([op, n]) => (n > 1 ? `${op}×${n}` : op));
    return parts.slice(0, limit).join(", ") + (parts.length > limit ? ", …" : "");
  }

  function seconds(s) { return s === undefined ? undefined : `${s.toFixed(2)} s`; }

  function showPanel() {
    panel.textContent = "";
    const sel = state.selected;
    if (!sel) return showOverview();
    if (sel.kind === "group") return showGroup(groups.get(sel.id));
    return showNode(nodes.get(sel.id));
  }

  function showOverview() {
    html("h2", dump.model, panel);
    const unfusedCount = graph.nodes.filter((n) => "unfused_reason" in n).length;
    facts([
      ["nodes", graph.nodes.length],
      ["groups", dump.groups.length],
      ["fused nodes", dump.fused_node_count],
      ["unfused nodes", unfusedCount],
      ["options", Object.entries(dump.options).map(([k, v]) => `${k} ${v}`).join(", ")],
    ], panel);
    if (hasReport) {
      const r = dump.report;
      html("h3", "optimize report", panel);
      facts([
        ["compiled", r.groups_compiled], ["cached", r.groups_cached], ["fell back", r.groups_fallback],
        ["fused fraction", r.fused_fraction !== undefined ? r.fused_fraction.toFixed(3) : undefined],
        ["run time", seconds(r.seconds)], ["output", r.output],
      ], panel);
    }
    html("h3", "groups", panel);
    const ul = html("ul", null, panel);
    for (const g of dump.groups) {
      const li = html("li", null, ul);
      const sw = html("span", null, li, "swatch");
      sw.style.background = groupFill(g.name, 70);
      link(g.name, { kind: "group", id: g.name }, li);
      html("span", ` ${g.size} ops${g.status ? " · " + g.status : ""}`, li, "muted");
    }
    const byReason = new Map();
    for (const n of graph.nodes) if ("unfused_reason" in n) {
      if (!byReason.has(n.unfused_reason)) byReason.set(n.unfused_reason, []);
      byReason.get(n.unfused_reason).push(n);
    }
    if (byReason.size) html("h3", "why nodes stay unfused", panel);
    for (const [reason, list] of byReason) {
      html("div", `${reason} (${list.length})`, panel, "reason");
      const p = html("div", null, panel);
      list.slice(0, 40).forEach((n, i) => { if (i) p.append(", "); link(`${n.op_type} ${n.name || n.id}`, { kind: "node", id: n.id }, p); });
      if (list.length > 40) p.append(` … ${list.length - 40} more`);
    }
  }

  function showGroup(g) {
    const h = html("h2", null, panel);
    const sw = html("span", null, h, "swatch");
    sw.style.background = groupFill(g.name, 70);
    h.append(g.name);
    facts([
      ["status", g.status || (hasReport ? undefined : "planned")],
      ["kernel", g.kernel],
      ["compile time", seconds(g.compile_seconds)],
      ["fallback", g.fallback_kind],
      ["scope", g.scope],
      ["ops", `${g.size}: ${opsSummary(g.op_types, 8)}`],
      ["reused values", g.reused_values ? `${g.reused_values} (up to ${g.max_reuse}×)` : undefined],
    ], panel);
    if (g.reason) html("div", g.reason, panel, "reason");
    if (g.measured && g.measured.length) {
      html("h3", "measured: kernel vs onnxruntime", panel);
      const table = html("table", null, panel);
      const head = html("tr", null, table);
      for (const c of ["batch", "threads", "kernel µs", "onnxruntime µs", "ratio"]) html("th", c, head);
      for (const m of g.measured) {
        const tr = html("tr", null, table);
        const ratio = m.speedup !== undefined ? m.speedup : m.onnxruntime_us / m.kernel_us;
        for (const c of [m.batch, m.threads, m.kernel_us.toFixed(1), m.onnxruntime_us.toFixed(1), `${ratio.toFixed(2)}×`]) html("td", String(c), tr, "fact");
      }
    }
    const actions = html("div", null, panel);
    if (viewName() === "plan" && drawn.clusters.has(g.name)) {
      const b = html("button", state.folded.has(g.name) ? "unfold" : "fold into one box", actions);
      b.type = "button";
      b.addEventListener("click", () => { toggleFold(g.name); showPanel(); });
    } else if (viewName() !== "plan") {
      const b = html("button", "show its nodes", actions);
      b.type = "button";
      b.addEventListener("click", () => { state.graph = "original"; state.collapse = false; state.folded.delete(g.name); syncControls(); draw(); centerOn(state.selected); showPanel(); });
    }
    html("h3", "inputs", panel);
    const ins = html("ul", null, panel);
    for (const v of g.inputs) html("li", valueText(v, g.scope), ins);
    html("h3", "outputs", panel);
    const outs = html("ul", null, panel);
    for (const v of g.outputs) html("li", valueText(v, g.scope), outs);
    html("h3", "nodes", panel);
    const members = html("ol", null, panel);
    for (const index of g.node_indices) {
      const n = nodes.get(`${g.scope || ""}#${index}`);
      link(`${n.op_type} ${n.name || n.id}`, { kind: "node", id: n.id }, html("li", null, members));
    }
  }

  function showNode(n) {
    html("h2", `${n.op_type} ${n.name}`, panel);
    const groupLink = n.group ? document.createElement("span") : null;
    if (groupLink) link(n.group, { kind: "group", id: n.group }, groupLink);
    facts([
      ["node", n.id], ["name", n.name], ["op type", n.op_type], ["domain", n.domain || "ai.onnx"],
      ["scope", n.scope], ["group", groupLink],
    ], panel);
    if (n.unfused_reason) html("div", `unfused: ${n.unfused_reason}`, panel, "reason");
    html("h3", "inputs", panel);
    const ins = html("ul", null, panel);
    for (const v of n.inputs) html("li", valueText(v, n.scope), ins);
    html("h3", "outputs", panel);
    const outs = html("ul", null, panel);
    for (const v of n.outputs) html("li", valueText(v, n.scope), outs);
    const attrs = Object.entries(n.attributes);
    if (attrs.length) {
      html("h3", "attributes", panel);
      facts(attrs, panel);
    }
    const near = (ids, title) => {
      if (!ids.length) return;
      html("h3", title, panel);
      const p = html("div", null, panel);
      ids.forEach((id, i) => { if (i) p.append(", "); const m = nodes.get(id); link(`${m.op_type} ${m.name || m.id}`, { kind: "node", id }, p); });
    };
    near([...new Set(graph.edges.filter((e) => e.to === n.id).map((e) => e.from))], "reads from");
    near([...new Set(graph.edges.filter((e) => e.from === n.id).map((e) => e.to))], "feeds");
  }

  // ---- search by node name, op type, group or kernel name
  function runSearch() {
    const q = search.value.trim().toLowerCase();
    state.matches = [];
    state.matchAt = -1;
    if (q) {
      for (const n of graph.nodes) {
        if (n.op_type.toLowerCase().includes(q) || (n.name || "").toLowerCase().includes(q)) state.matches.push({ kind: "node", id: n.id });
      }
      for (const g of dump.groups) {
        if (g.name.toLowerCase() === q || (g.kernel || "").toLowerCase().includes(q)) state.matches.push({ kind: "group", id: g.name });
      }
    }
    searchCount.textContent = q ? `${state.matches.length} match${state.matches.length === 1 ? "" : "es"}` : "";
    applyMarks();
  }

  function nextMatch() {
    if (!state.matches.length) return;
    state.matchAt = (state.matchAt + 1) % state.matches.length;
    const m = state.matches[state.matchAt];
    searchCount.textContent = `${state.matchAt + 1} of ${state.matches.length}`;
    select(m);
    centerOn(m);
  }

  // ---- zoom and pan: the viewBox keeps the canvas's aspect ratio, so 1 unit = `scale()` pixels
  function scale() { return svg.clientWidth / state.vb.w; }
  function setViewBox() {
    const { x, y, w, h } = state.vb;
    svg.setAttribute("viewBox", `${x} ${y} ${w} ${h}`);
  }
  function fit() {
    const layout = DATA.layouts[viewName()];
    const cw = svg.clientWidth || 800, ch = svg.clientHeight || 600;
    let s = Math.min(cw / (layout.width + 20), ch / (layout.height + 20));
    let top = -10;
    if (s < 0.35) { s = Math.max(s, Math.min(0.7, cw / (layout.width + 20))); top = -10; } // tall graphs: readable, from the top
    state.vb = { w: cw / s, h: ch / s, x: layout.width / 2 - cw / s / 2, y: s * (layout.height + 20) <= ch ? layout.height / 2 - ch / s / 2 : top };
    setViewBox();
  }
  function zoomAt(factor, px, py) {
    const { x, y, w, h } = state.vb;
    const ux = x + (px / svg.clientWidth) * w, uy = y + (py / svg.clientHeight) * h;
    state.vb = { w: w / factor, h: h / factor, x: ux - (ux - x) / factor, y: uy - (uy - y) / factor };
    setViewBox();
  }
  function centerOn(sel) {
    const d = drawnFor(sel);
    if (!d) return;
    const [x, y, w, h] = d.rect;
    const cw = svg.clientWidth || 800, ch = svg.clientHeight || 600;
    const s = Math.max(0.6, Math.min(1.5, scale(), cw / (w + 40), ch / (h + 40)));
    state.vb = { w: cw / s, h: ch / s, x: x + w / 2 - cw / s / 2, y: y + h / 2 - ch / s / 2 };
    setViewBox();
  }

  let drag = null, dragged = false;
  function wasDrag() { return dragged; }
  svg.addEventListener("pointerdown", (ev) => { drag = { x: ev.clientX, y: ev.clientY, vb: { ...state.vb } }; dragged = false; });
  window.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (!dragged && Math.abs(dx) + Math.abs(dy) < 4) return;
    dragged = true;
    svg.classList.add("panning");
    const s = svg.clientWidth / drag.vb.w;
    state.vb = { ...drag.vb, x: drag.vb.x - dx / s, y: drag.vb.y - dy / s };
    setViewBox();
  });
  window.addEventListener("pointerup", () => { drag = null; svg.classList.remove("panning"); setTimeout(() => { dragged = false; }, 0); });
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    zoomAt(Math.exp(-ev.deltaY * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
  }, { passive: false });
  svg.addEventListener("click", () => { if (!wasDrag()) select(null); });
  document.getElementById("zoom-in").addEventListener("click", () => zoomAt(1.25, svg.clientWidth / 2, svg.clientHeight / 2));
  document.getElementById("zoom-out").addEventListener("click", () => zoomAt(0.8, svg.clientWidth / 2, svg.clientHeight / 2));
  document.getElementById("zoom-fit").addEventListener("click", fit);

  // ---- controls
  function syncControls() {
    document.getElementById("show-original").classList.toggle("on", state.graph === "original");
    document.getElementById("show-fused").classList.toggle("on", state.graph === "fused");
    collapse.checked = state.collapse;
    collapse.disabled = state.graph === "fused";
    document.getElementById("collapse-label").classList.toggle("disabled", collapse.disabled);
  }
  function setView(graphName, collapsed) {
    state.graph = graphName;
    state.collapse = collapsed;
    syncControls();
    draw();
    fit();
    showPanel();
  }
  document.getElementById("show-original").addEventListener("click", () => setView("original", state.collapse));
  document.getElementById("show-fused").addEventListener("click", () => setView("fused", state.collapse));
  collapse.addEventListener("change", () => setView("original", collapse.checked));
  search.addEventListener("input", runSearch);
  search.addEventListener("keydown", (ev) => { if (ev.key === "Enter") nextMatch(); });
  window.addEventListener("resize", () => { state.vb.h = state.vb.w * svg.clientHeight / Math.max(1, svg.clientWidth); setViewBox(); });

  document.getElementById("title").textContent = `${dump.model} · ${graph.nodes.length} nodes · ${dump.groups.length} groups`;
  // a link may open a view and select a group or node: page.html#view=plan&select=group_3
  const linked = new URLSearchParams(location.hash.startsWith("#selftest") ? "" : location.hash.slice(1));
  const views = { plan: ["original", false], collapsed: ["original", true], fused: ["fused", state.collapse] };
  setView(...(views[linked.get("view")] || ["original", state.collapse]));
  const target = linked.get("select");
  const linkedSel = groups.has(target) ? { kind: "group", id: target } : nodes.has(target) ? { kind: "node", id: target } : null;
  if (linkedSel) { select(linkedSel); centerOn(linkedSel); }

  // ---- test hook: `#selftest` records, for each view, which groups and unfused nodes are drawn,
  // then clicks the group named by `select=` and keeps the side panel's text (tests read the DOM).
  if (location.hash.startsWith("#selftest")) {
    const params = new URLSearchParams(location.hash.slice("#selftest".length).replace(/^[&?]/, ""));
    const visible = (e) => !e.closest(".hidden") && e.getBBox().width > 0;
    const result = { views: {} };
    for (const [name, graphName, collapsed] of [["plan", "original", false], ["collapsed", "original", true], ["fused", "fused", false]]) {
      setView(graphName, collapsed);
      result.views[name] = {
        groups: [...new Set([...viewport.querySelectorAll(".cluster.group, .box.group, .box.kernel")].filter(visible).map((e) => e.dataset.group))],
        kernels: [...viewport.querySelectorAll(".box.kernel")].filter(visible).map((e) => e.dataset.group),
        unfused: [...viewport.querySelectorAll(".box.unfused")].filter(visible).map((e) => e.dataset.id),
        boxes: viewport.querySelectorAll(".box").length,
      };
    }
    setView("original", DATA.start_collapsed);
    result.start = viewName();
    const target = params.get("select");
    if (target) {
      const d = drawnFor({ kind: "group", id: target });
      if (d) d.el.dispatchEvent(new MouseEvent("click", { bubbles: true }));
      result.selected = state.selected;
      result.panel = panel.innerText;
    }
    if (params.get("search")) {
      search.value = params.get("search");
      search.dispatchEvent(new Event("input"));
      result.search = { count: searchCount.textContent, marked: viewport.querySelectorAll(".match").length };
    }
    const out = document.createElement("pre");
    out.id = "selftest-result";
    out.hidden = true;
    out.textContent = JSON.stringify(result);
    document.body.appendChild(out);
  }
})();
