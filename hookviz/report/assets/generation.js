// hookviz generation report: the list of prompts (sort, filter, pages, state in the URL) and a prompt's detail view:
// per method, each generated token's scores over the source (the prompt and the tokens generated before it), drawn
// from the stored scores (hookviz.report.gendata) as the source coloured by one generated token and as a (generated
// x source) heat map. Plain DOM, no framework; every text that comes from data is set with textContent only.
"use strict";
(function () {
  const D = window.HV_DATA;
  const PAGE = 50;
  const S = window.HVSite, { $, el } = S;

  // ------------------------------------------------------------------ colours and numbers
  const POSITIVE = [214, 39, 40], NEGATIVE = [31, 119, 180];
  // hookviz.text.token_colour: the sign's hue (red: for the generated token, blue: against), alpha |value| / scale
  function tokenColour(v, scale) {
    const a = scale > 0 ? Math.min(Math.abs(v) / scale, 1) : 0;
    return [...(v >= 0 ? POSITIVE : NEGATIVE), a];
  }
  const css = (c) => "rgba(" + c[0] + ", " + c[1] + ", " + c[2] + ", " + c[3].toFixed(3) + ")";
  // hookviz.generation.views.finite_max: the largest |value|, 0 where that is not finite
  function finiteMax(values) {
    let m = 0;
    for (const v of values) m = Math.max(m, Math.abs(v));
    return Number.isFinite(m) ? m : 0;
  }
  const sig = (v) => (v === null || v === undefined ? "—" : Number(v).toPrecision(4)); // 4 significant digits
  const signed = (v, s) => (v >= 0 ? "+" : "") + s;
  // the shortest text that reads back as the stored float32 (or float64) value: exact on hover
  function exact(v, f32) {
    if (!Number.isFinite(v) || !f32) return signed(v, String(v));
    for (let p = 1; p < 9; p++) { const s = v.toPrecision(p); if (Math.fround(+s) === v) return signed(v, s); }
    return signed(v, v.toPrecision(9));
  }
  // newlines stay visible as tokens (hookviz.generation.views)
  const shown = (t) => t.replace(/\n/g, "\u21b5");
  function shorten(text, n) {
    text = shown(text);
    return text.length <= n ? text : text.slice(0, Math.round(n * 0.65)) + " … " + text.slice(text.length - Math.round(n * 0.3));
  }

  // ------------------------------------------------------------------ the scores files
  const loadBlock = S.scriptBlocks("data/g", "gen"), decoded = {};
  // a block's prompts with each method's (G, S) scores decoded (hookviz.report.gendata: byte planes, little-endian)
  function loadScores(block) {
    if (!decoded[block]) {
      decoded[block] = loadBlock(block).then((items) => Promise.all(items.flatMap((it) => it.m.map(async (r) => {
        const planes = await S.inflate(r.z), size = r.dtype === "f8" ? 8 : 4, n = planes.length / size;
        const bytes = new Uint8Array(planes.length);
        for (let b = 0; b < size; b++) for (let q = 0; q < n; q++) bytes[q * size + b] = planes[b * n + q];
        const dv = new DataView(bytes.buffer), values = new Float64Array(n);
        for (let q = 0; q < n; q++) values[q] = size === 8 ? dv.getFloat64(q * 8, true) : dv.getFloat32(q * 4, true);
        r.values = values;
      }))).then(() => items));
      decoded[block].catch(() => { delete decoded[block]; });
    }
    return decoded[block];
  }
  // one method's scores of a prompt in tokens: rows of the (G, S) matrix
  function tokensOf(it, r) {
    const width = it.src.length, rows = [];
    for (let g = 0; g < it.gen.length; g++) rows.push(r.values.subarray(g * width, (g + 1) * width));
    return { src: it.src, gen: it.gen, p: it.p, rows, steps: it.steps, contrast: r.contrast, exact: r.dtype };
  }
  // step scores of a word from its pieces' (GenerationExplanation.aggregate): probabilities multiplied,
  // log-probabilities summed, the entropy of the most uncertain piece
  function combine(name, vs) {
    if (vs.some((v) => v === null)) return null;
    if (name === "probability") return vs.reduce((a, v) => a * v, 1);
    if (name === "log-probability") return vs.reduce((a, v) => a + v, 0);
    return Math.max(...vs);
  }
  // GenerationExplanation.aggregate("words"), redone here: a word's pieces joined (a group never crosses the end of
  // the prompt), its columns summed, a generated word's row the sum of its pieces' rows (0 at and after itself)
  function wordsOf(it, r) {
    const t = tokensOf(it, r);
    if (!it.starts) return t;
    const total = it.src.length, p = it.p, groups = [];
    for (let j = 0; j < total; j++) {
      if (j === 0 || it.starts[j] === "1" || j === p) groups.push([j]);
      else groups[groups.length - 1].push(j);
    }
    const col = new Int32Array(total);
    groups.forEach((members, c) => { for (const j of members) col[j] = c; });
    const gen = groups.filter((members) => members[0] >= p).map((members) => members.map((j) => j - p));
    const nPrompt = groups.length - gen.length;
    const rows = gen.map((members, k) => {
      const row = new Float64Array(groups.length);
      for (const g of members) { const src = t.rows[g]; for (let j = 0; j < total; j++) row[col[j]] += src[j]; }
      return row.fill(0, nPrompt + k);
    });
    const join = (texts, members) => members.map((j) => texts[j]).join("");
    const steps = {};
    for (const [name, v] of Object.entries(it.steps)) steps[name] = gen.map((members) => combine(name, members.map((g) => v[g])));
    return { src: groups.map((m) => join(it.src, m)), gen: gen.map((m) => join(it.gen, m)), p: nPrompt, rows, steps,
      contrast: r.contrast ? gen.map((m) => join(r.contrast, m)) : null, exact: null }; // sums: shown to 6 digits
  }
  window.HV.units = (block, i, j, words) => loadScores(block).then((items) => { // for tests: a prompt's matrices
    const u = (words ? wordsOf : tokensOf)(items[i % D.block], items[i % D.block].m[j]);
    return { src: u.src, gen: u.gen, p: u.p, rows: u.rows.map((r) => Array.from(r)), steps: u.steps };
  });

  // ------------------------------------------------------------------ state in the URL
  const many = D.methods.length > 1;
  const defaults = { sort: "index", dir: "asc", page: 1, m: many ? "all" : "0", agg: "tokens", scale: "row", step: "0" };
  const state = { q: "", sort: "index", dir: "asc", page: 1, item: "", m: defaults.m, agg: "tokens", scale: "row", step: "0" };
  const url = S.urlState(state, defaults);

  // ------------------------------------------------------------------ the list
  const lower = D.prompts.map((p, i) => (p + "\n" + D.continuations[i]).toLowerCase());
  function sortKey() {
    if (state.sort === "p") return D.p;
    if (state.sort === "g") return D.g;
    if (state.sort.startsWith("s|")) return D.means[state.sort.slice(2)] || null;
    return null;
  }
  let view = [];
  function compute() {
    const q = state.q.trim().toLowerCase();
    view = [];
    for (let i = 0; i < D.n; i++) if (!q || lower[i].includes(q)) view.push(i);
    S.sortView(view, sortKey(), state.dir);
  }
  function row(i) {
    const tr = el("tr", { tabIndex: 0 });
    tr.dataset.item = i;
    tr.append(
      el("td", { className: "num", textContent: String(i) }),
      el("td", { className: "gen-text", textContent: shorten(D.prompts[i], 160) }),
      el("td", { className: "gen-text gen-cont", textContent: shorten(D.continuations[i], 200) }),
      el("td", { className: "num", textContent: D.p[i] + " + " + D.g[i] }));
    for (const name of D.steps) tr.append(el("td", { className: "num", textContent: sig(D.means[name][i]) }));
    tr.addEventListener("click", () => openItem(i, true));
    return tr;
  }
  function render() {
    compute();
    const pages = Math.max(1, Math.ceil(view.length / PAGE));
    state.page = Math.min(state.page, pages);
    document.querySelector("#grid tbody").replaceChildren(...view.slice((state.page - 1) * PAGE, state.page * PAGE).map(row));
    $("count").textContent = view.length + " of " + D.n + " prompts" + (pages > 1 ? ", page " + state.page + " of " + pages : "");
    S.pager(state, pages, render);
    url.write();
  }
  function setupControls() {
    $("source").textContent = D.n + " prompt" + (D.n === 1 ? "" : "s") + " · " + D.methods.map((m) => m.name).join(", ") + (D.steps.length ? " · step scores: " + D.steps.join(", ") : "");
    const head = el("tr", {},
      el("th", { scope: "col", textContent: "#" }), el("th", { scope: "col", textContent: "prompt" }),
      el("th", { scope: "col", textContent: "continuation" }), el("th", { scope: "col", textContent: "tokens (prompt + generated)" }));
    for (const name of D.steps) head.append(el("th", { scope: "col", textContent: "mean " + name }));
    document.querySelector("#grid thead").append(head);
    $("sort").append(el("option", { value: "index", textContent: "prompt file order" }), el("option", { value: "p", textContent: "prompt tokens" }), el("option", { value: "g", textContent: "generated tokens" }));
    for (const name of D.steps) $("sort").append(el("option", { value: "s|" + name, textContent: "mean " + name }));
    D.methods.forEach((m, j) => $("d-method").append(el("option", { value: String(j), textContent: m.name })));
    if (many) $("d-method").append(el("option", { value: "all", textContent: "all, one under the other" }));
    if (!D.pieces) { $("d-agg").disabled = true; $("d-agg").title = "every word is one token here"; }
    const ids = { q: "q", sort: "sort", dir: "dir", m: "d-method", agg: "d-agg", scale: "d-scale" };
    const sync = () => { for (const [k, id] of Object.entries(ids)) $(id).value = state[k]; };
    sync();
    for (const [k, id] of Object.entries(ids)) $(id).addEventListener(k === "q" ? "input" : "change", () => {
      state[k] = $(id).value;
      if (k === "m" || k === "agg" || k === "scale") { if (k === "agg") state.step = "0"; url.write(); redraw(); return; }
      state.page = 1; render();
    });
    window.addEventListener("hashchange", () => { url.read(); sync(); render(); state.item !== "" ? openItem(+state.item, false) : detail.close(); });
  }

  // ------------------------------------------------------------------ the detail view
  function openItem(i, fresh) {
    if (!(i >= 0 && i < D.n)) return;
    if (fresh && String(i) !== state.item) state.step = "0";
    detail.open(i);
  }
  function showDetail(i) {
    $("detail-title").textContent = "prompt #" + i;
    const means = D.steps.map((name) => "mean " + name + " " + sig(D.means[name][i]));
    $("detail-info").textContent = [D.p[i] + " prompt tokens", D.g[i] + " generated", ...means].join(" · ");
    $("detail-title").focus();
    redraw();
  }
  function redraw() {
    const i = detail.current;
    if (i !== null) loadScores(Math.floor(i / D.block)).then((items) => { if (detail.current === i) drawDetail(i, items); });
  }
  function stepTitle(u, k) {
    const parts = Object.entries(u.steps).map(([name, v]) => name + " " + (v[k] === null ? "—" : Number(v[k]).toPrecision(4)));
    return "generated " + (state.agg === "words" ? "word " : "token ") + k + (parts.length ? ": " + parts.join(", ") : "");
  }
  // one scored source token: its colour on the scale `s`, its exact score in the title
  function scored(tag, u, row, c, g, s) {
    const e = el(tag, tag === "span" ? { textContent: shown(u.src[c]) } : {});
    e.style.backgroundColor = css(tokenColour(row[c], s));
    e.title = shown(u.src[c]) + " → " + shown(u.gen[g]) + ": " + (u.exact ? exact(row[c], u.exact === "f4") : signed(row[c], row[c].toPrecision(6)));
    return e;
  }
  // the source up to generated token g coloured by its row, then the token itself, outlined
  function tokenLine(u, g, scale) {
    const row = u.rows[g], line = el("div", { className: "gen-line" });
    for (let c = 0; c < u.p + g; c++) line.append(scored("span", u, row, c, g, scale(row)));
    line.append(el("span", { className: "gen-target", textContent: shown(u.gen[g]), title: stepTitle(u, g) }));
    if (u.contrast) line.append(" vs ", el("b", { textContent: shown(u.contrast[g]) }));
    return line;
  }
  function methodView(j, u, g) {
    const m = D.methods[j], big = finiteMax((function* () { for (const r of u.rows) yield* r; })()); // the matrix's
    const scale = (r) => (state.scale === "prompt" ? big : finiteMax(r));
    const section = el("section", { className: "gen-method" });
    section.dataset.method = j;
    const what = " · the " + m.score + " of each generated " + (state.agg === "words" ? "word" : "token") + (m.contrast ? " against its contrast" : "") + (state.scale === "prompt" ? "; largest |score| " + big.toPrecision(4) : "");
    section.append(el("h3", {}, el("span", { textContent: m.name + (m.method !== m.name ? " (" + m.method + ")" : "") }), el("small", { className: "muted", textContent: what })));
    if (!u.gen.length) { section.append(el("p", { textContent: "nothing generated (or only special tokens)" })); return { section }; }
    const line = tokenLine(u, g, scale);
    section.append(line);
    // the heat map: generated (rows) x source (columns); at and after a row's own token nothing is seen (grey)
    const table = el("table", { className: "heat" });
    table.setAttribute("aria-label", m.name + ": generated tokens (rows) by source tokens (columns)");
    const head = el("tr", {}, el("th", { scope: "col", className: "corner", textContent: "generated ↓, source →" }));
    u.src.forEach((t, c) => head.append(el("th", { scope: "col", className: c === u.p ? "src gen-start" : "src" }, el("span", { textContent: shown(t) }))));
    const rows = u.rows.map((r, k) => {
      const s = scale(r), tr = document.createElement("tr"), cells = [];
      if (k === g) tr.className = "chosen";
      const th = el("th", { scope: "row", textContent: shown(u.gen[k]), title: stepTitle(u, k) });
      th.addEventListener("click", () => select(k));
      cells.push(th);
      for (let c = 0; c < u.src.length; c++) {
        let td;
        if (c < u.p + k) td = scored("td", u, r, c, k, s);
        else { td = document.createElement("td"); td.className = "future"; }
        if (c === u.p) td.classList.add("gen-start");
        cells.push(td);
      }
      tr.append(...cells);
      return tr;
    });
    table.append(el("thead", {}, head), el("tbody", {}, ...rows));
    section.append(el("div", { className: "heat-wrap" }, table));
    return { section, line, rows, redo: (k) => tokenLine(u, k, scale) };
  }
  // what is drawn: choosing another generated token redraws its token lines only, not the heat maps
  let drawn = null;
  function select(k) {
    state.step = String(k); url.write();
    if (!drawn || drawn.i !== detail.current) return redraw();
    drawn.buttons.forEach((b, q) => b.setAttribute("aria-pressed", String(q === k)));
    for (const v of drawn.views) {
      if (!v.line) continue;
      const line = v.redo(k);
      v.line.replaceWith(line); v.line = line;
      v.rows.forEach((tr, q) => { tr.className = q === k ? "chosen" : ""; });
    }
    $("detail-body").dataset.view = [state.m, state.agg, state.scale, k].join(",");
  }
  function drawDetail(i, items) {
    const it = items[i % D.block];
    if (state.agg === "words" && !D.pieces) state.agg = "tokens";
    const js = state.m === "all" ? D.methods.map((_, j) => j) : [Math.min(Math.max(0, parseInt(state.m, 10) || 0), D.methods.length - 1)];
    const units = js.map((j) => (state.agg === "words" ? wordsOf : tokensOf)(it, it.m[j]));
    const first = units[0], g = Math.min(Math.max(0, parseInt(state.step, 10) || 0), Math.max(0, first.gen.length - 1));
    const steps = el("div", { className: "gen-steps" });
    steps.setAttribute("role", "group");
    steps.setAttribute("aria-label", "generated tokens: choose one to colour the source by it");
    const buttons = first.gen.map((t, k) => {
      const b = el("button", { type: "button", textContent: shown(t), title: stepTitle(first, k) });
      b.setAttribute("aria-pressed", String(k === g));
      b.addEventListener("click", () => select(k));
      steps.append(b);
      return b;
    });
    const views = js.map((j, k) => methodView(j, units[k], g));
    $("detail-body").replaceChildren(
      el("h3", { textContent: "Prompt" }), el("p", { className: "gen-prompt", textContent: it.prompt }),
      el("h3", { textContent: "Continuation" }), steps,
      el("p", { className: "muted legend", textContent: "Per method: the source coloured by the chosen generated token, then the heat map (rows: generated tokens, columns: source tokens; hatched: the token itself and what follows, which the model could not see). Red: for the generated token, blue: against; " + (state.scale === "prompt" ? "one scale per prompt and method" : "each generated token on its own scale") + ". Hover for the exact score." }),
      ...views.map((v) => v.section));
    drawn = { i, buttons, views };
    $("detail-body").dataset.view = [state.m, state.agg, state.scale, g].join(",");
    $("detail-body").dataset.drawn = String(i);
  }
  const detail = S.detail(state, url, showDetail, () => view);

  function start() {
    url.read();
    setupControls();
    render();
    if (state.item !== "") openItem(+state.item, false);
    document.body.dataset.ready = "1";
  }
  start();
})();
