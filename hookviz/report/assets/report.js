// hookviz report: the grid (sort, filter, pages, URL state) and the detail view (display modes redone from the
// stored maps, as hookviz.display.normalize does them). Plain DOM, no framework; text is set with textContent only.
// What both reports share (URL state, pager, data files, keys, the detail view's steps) is in site.js.
"use strict";
(function () {
  const D = window.HV_DATA;
  const PAGE = 50;
  const EPS = 1e-8;
  const { $, el, fmt } = window.HVSite;
  const cls = (k) => (k === null || k === undefined || k < 0 ? "—" : D.classes && k < D.classes.length ? D.classes[k] : String(k));
  const known = (a) => Array.isArray(a);
  const correct = (i) => (known(D.labels) && known(D.preds) ? D.labels[i] === D.preds[i] : null);

  // ------------------------------------------------------------------ display maths (hookviz.display)
  function applySign(a, sign) {
    if (sign === "all") return a;
    const out = new Float64Array(a.length);
    for (let i = 0; i < a.length; i++) {
      const v = a[i];
      out[i] = sign === "positive" ? Math.max(v, 0) : sign === "negative" ? Math.max(-v, 0) : Math.abs(v);
    }
    return out;
  }
  function quantileAbs(a, q) {
    const s = Float64Array.from(a, Math.abs).sort();
    const pos = q * (s.length - 1), lo = Math.floor(pos), hi = Math.min(lo + 1, s.length - 1);
    return s[lo] + (s[hi] - s[lo]) * (pos - lo);
  }
  function massThreshold(a, percentile) {
    const s = Float64Array.from(a, Math.abs).sort();
    let total = 0;
    for (const v of s) total += v;
    const target = total * 0.01 * percentile;
    let cum = 0, idx = 0;
    for (; idx < s.length; idx++) { cum += s[idx]; if (cum >= target) break; }
    const t = s[Math.min(idx, s.length - 1)];
    return t > 0 ? t : 1;
  }
  // statistics of one mode over the values `a` (a Float64Array after the sign)
  function statistics(a, mode, percentile) {
    if (mode === "seed") {
      let m = 0; for (const v of a) m += v; m /= a.length;
      let q = 0; for (const v of a) q += (v - m) * (v - m);
      return [m, Math.sqrt(q / a.length)];
    }
    if (mode === "minmax") { let lo = Infinity, hi = -Infinity; for (const v of a) { if (v < lo) lo = v; if (v > hi) hi = v; } return [lo, hi]; }
    if (mode === "absmax") { let m = 0; for (const v of a) m = Math.max(m, Math.abs(v)); return [m, null]; }
    if (mode === "percentile") return [quantileAbs(a, (percentile ?? D.percentile.percentile) / 100), null];
    return [massThreshold(a, percentile ?? D.percentile.mass), null];
  }
  function normalizeWith(a, mode, signed, s1, s2) {
    const out = new Float32Array(a.length);
    const clip = (r) => (signed ? Math.min(1, Math.max(-1, r)) * 0.5 + 0.5 : Math.min(1, Math.max(0, r)));
    for (let i = 0; i < a.length; i++) {
      const v = a[i];
      let r;
      if (mode === "seed") r = Math.min(1, Math.max(0, ((v - s1) / (s2 + EPS)) * 0.1 + 0.5));
      else if (mode === "minmax") r = Math.min(1, Math.max(0, (v - s1) / (s2 - s1 + EPS)));
      else if (mode === "absmax") r = signed ? Math.min(1, Math.max(0, v / (2 * s1 + EPS) + 0.5)) : Math.min(1, Math.max(0, v / (s1 + EPS)));
      else if (mode === "percentile") r = clip(v / (s1 + EPS));
      else r = clip(v / s1);
      out[i] = r;
    }
    return out;
  }
  // normalize several maps (arrays of raw values) with one option set; scale "shared": one set of statistics
  function normalizeMaps(maps, o) {
    const signed = o.sign === "all";
    const vals = maps.map((m) => applySign(m, o.sign));
    if (o.scale === "shared") {
      const all = new Float64Array(vals.reduce((n, v) => n + v.length, 0));
      let k = 0; for (const v of vals) { all.set(v, k); k += v.length; }
      const [s1, s2] = statistics(all, o.mode, o.percentile);
      return vals.map((v) => normalizeWith(v, o.mode, signed, s1, s2));
    }
    return vals.map((v) => { const [s1, s2] = statistics(v, o.mode, o.percentile); return normalizeWith(v, o.mode, signed, s1, s2); });
  }
  // bilinear resize of one (h, w) plane to (H, W), align_corners=False, as torch.nn.functional.interpolate
  function resize(p, h, w, H, W) {
    if (h === H && w === W) return p;
    const out = new Float32Array(H * W), sy = h / H, sx = w / W;
    for (let y = 0; y < H; y++) {
      const fy = Math.max(0, (y + 0.5) * sy - 0.5), y0 = Math.floor(fy), y1 = Math.min(y0 + 1, h - 1), ly = fy - y0;
      for (let x = 0; x < W; x++) {
        const fx = Math.max(0, (x + 0.5) * sx - 0.5), x0 = Math.floor(fx), x1 = Math.min(x0 + 1, w - 1), lx = fx - x0;
        out[y * W + x] = (1 - ly) * ((1 - lx) * p[y0 * w + x0] + lx * p[y0 * w + x1]) + ly * ((1 - lx) * p[y1 * w + x0] + lx * p[y1 * w + x1]);
      }
    }
    return out;
  }
  const luts = {};
  function lut(name) {
    if (!luts[name]) luts[name] = Uint8Array.from(atob(D.luts[name]), (c) => c.charCodeAt(0));
    return luts[name];
  }
  window.HV = window.HV || {};
  window.HV.normalizeMaps = normalizeMaps; // for tests: compared with hookviz.display.normalize

  // ------------------------------------------------------------------ the maps files (script tags: file:// safe)
  const decoded = {};
  const loadBlock = window.HVSite.scriptBlocks("maps", "maps"), inflate = window.HVSite.inflate;
  // a block's records with their 16-bit codes decoded (hookviz.report.mapdata: high-byte plane, then low-byte plane)
  function loadMaps(block) {
    if (!decoded[block]) {
      decoded[block] = loadBlock(block).then((records) => Promise.all(records.map(async (r) => {
        const planes = await inflate(r.z), n = planes.length / 2, codes = new Uint16Array(n);
        for (let q = 0; q < n; q++) codes[q] = (planes[q] << 8) | planes[n + q];
        r.codes = codes;
      })).then(() => records));
      decoded[block].catch(() => { delete decoded[block]; });
    }
    return decoded[block];
  }
  // raw values of item i's map from method j: Float64Array of C*h*w, with its shape
  function rawMap(records, j, i) {
    const r = records[j], [c, h, w] = r.shape, size = c * h * w, k = i % D.block;
    const lo = r.lo[k], step = r.step[k], out = new Float64Array(size);
    for (let q = 0; q < size; q++) out[q] = lo + r.codes[k * size + q] * step; // as hookviz.report.mapdata.decode
    return { values: out, shape: [c, h, w] };
  }

  // ------------------------------------------------------------------ method thumbnails, drawn from the maps
  // What hookviz.report.thumbnails.render draws (Explanation.overlay / .heatmap with the method's display defaults,
  // each map on its own scale), resized to the thumbnail as the Python side resizes it: drawn here instead of
  // being stored as a PNG per method and item. Returns {rgb: 3 planes of 0..255 floats, alpha: null (opaque), a
  // number, or a plane of opacities in [0, 1]} at the thumbnail's size.
  function thumbLayer(m, raw) {
    const [H, W] = D.full, [th, tw] = D.thumb;
    let [c, h, w] = raw.shape, values = raw.values;
    const size = h * w;
    if (m.overlay && c === 3) { // Explanation.overlay reduces what is not one channel with max-abs
      const out = new Float64Array(size);
      for (let q = 0; q < size; q++) out[q] = Math.max(Math.abs(values[q]), Math.abs(values[size + q]), Math.abs(values[2 * size + q]));
      values = out; c = 1;
    }
    const v = normalizeMaps([values], { mode: m.mode, sign: m.sign, scale: "sample", percentile: m.percentile })[0];
    const planes = [];
    for (let ch = 0; ch < c; ch++) planes.push(resize(v.subarray(ch * size, (ch + 1) * size), h, w, H, W));
    let rgb = [new Float32Array(H * W), new Float32Array(H * W), new Float32Array(H * W)];
    if (c === 3) for (let ch = 0; ch < 3; ch++) for (let q = 0; q < H * W; q++) rgb[ch][q] = planes[ch][q] * 255;
    else {
      const table = lut(m.cmap), p = planes[0];
      for (let q = 0; q < H * W; q++) {
        const idx = Math.min(255, Math.floor(Math.min(1, Math.max(0, p[q])) * 256));
        for (let ch = 0; ch < 3; ch++) rgb[ch][q] = table[3 * idx + ch];
      }
    }
    let alpha = null;
    if (m.overlay && m.alphaByMap) { // hookviz.display.magnitude: |a| on a scale that starts at 0
      const zero = m.mode === "absmax" || m.mode === "percentile" || m.mode === "mass";
      const wv = normalizeMaps([applySign(values, m.sign)], { mode: zero ? m.mode : "percentile", sign: "absolute", scale: "sample", percentile: zero ? m.percentile : null })[0];
      const big = resize(wv, h, w, H, W);
      alpha = new Float32Array(H * W);
      for (let q = 0; q < H * W; q++) alpha[q] = m.alpha * Math.min(1, Math.max(0, big[q]));
    } else if (m.overlay) alpha = m.alpha;
    if (th !== H || tw !== W) { // the thumbnail is the full-size drawing resized (alpha by map is not drawn here then)
      rgb = rgb.map((p) => resize(p, H, W, th, tw));
    }
    return { rgb, alpha };
  }
  const sheets = {};
  function sheet(s) { // the images' sprite sheet s, loaded once
    if (!sheets[s]) sheets[s] = new Promise((resolve, reject) => {
      const img = new Image();
      img.onload = () => resolve(img);
      img.onerror = () => reject(new Error("cannot load " + img.src));
      img.src = "img/" + s + ".png";
    });
    return sheets[s];
  }
  async function drawThumb(canvas) {
    const i = +canvas.dataset.item, j = +canvas.dataset.method, m = D.methods[j], [th, tw] = D.thumb;
    const records = await loadMaps(Math.floor(i / D.block));
    const { rgb, alpha } = thumbLayer(m, rawMap(records, j, i));
    const px = new ImageData(tw, th);
    for (let q = 0; q < th * tw; q++) {
      for (let ch = 0; ch < 3; ch++) px.data[4 * q + ch] = Math.round(rgb[ch][q]);
      px.data[4 * q + 3] = alpha === null ? 255 : Math.round((typeof alpha === "number" ? alpha : alpha[q]) * 255);
    }
    const ctx = canvas.getContext("2d");
    if (alpha === null) ctx.putImageData(px, 0, 0);
    else {
      const img = await sheet(Math.floor(i / D.sprite));
      const layer = el("canvas", { width: tw, height: th });
      layer.getContext("2d").putImageData(px, 0, 0);
      ctx.drawImage(img, (i % D.sprite) * tw, 0, tw, th, 0, 0, tw, th);
      ctx.drawImage(layer, 0, 0); // canvas blending in 8 bits: within 1 of hookviz.display.overlay (tests)
    }
    canvas.dataset.drawn = "1";
  }
  // only thumbnails in (or near) view are drawn: a page of a large report loads the map files of its own rows only
  const seen = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    for (const e of entries) if (e.isIntersecting) {
      seen.unobserve(e.target);
      drawThumb(e.target).catch((err) => { e.target.dataset.drawn = "error"; console.error(err); });
    }
  }, { rootMargin: "300px" }) : null;
  function mapTile(j, i, label) {
    const c = el("canvas", { width: D.thumb[1], height: D.thumb[0], className: "tile" });
    c.dataset.item = i; c.dataset.method = j;
    c.setAttribute("role", "img");
    c.setAttribute("aria-label", label);
    if (seen) seen.observe(c); else drawThumb(c);
    return c;
  }

  // ------------------------------------------------------------------ state in the URL
  const state = { q: "", cls: "", ok: "", sort: "index", dir: "asc", fm: "", fop: "", fv: "", page: 1, item: "" };
  const url = window.HVSite.urlState(state, { sort: "index", dir: "asc", page: 1 });

  // ------------------------------------------------------------------ sort keys and filters
  function metricValues(key) { // "m|<method index>|<metric>" or "s|<method index>"
    const [kind, j, metric] = key.split("|");
    const m = D.methods[+j];
    return kind === "s" ? m.scores : (m.metrics[metric] || null);
  }
  function sortKey() {
    if (state.sort === "prob" && known(D.probs)) return D.probs;
    if (state.sort === "name") return D.names;
    if (state.sort.startsWith("m|") || state.sort.startsWith("s|")) return metricValues(state.sort);
    return null;
  }
  let view = [];
  function compute() {
    const q = state.q.trim().toLowerCase();
    const c = state.cls === "" ? null : +state.cls;
    const fm = state.fm || $("fm").value; // the shown choice counts even before it was changed
    const fvals = fm && state.fop && state.fv !== "" ? metricValues(fm) : null;
    const fv = parseFloat(state.fv);
    view = [];
    for (let i = 0; i < D.n; i++) {
      if (c !== null && (!known(D.labels) || D.labels[i] !== c)) continue;
      if (state.ok && correct(i) !== (state.ok === "right")) continue;
      if (fvals) { const v = fvals[i]; if (v === null || (state.fop === "lt" ? !(v < fv) : !(v > fv))) continue; }
      if (q) {
        const text = [D.names[i], known(D.labels) ? cls(D.labels[i]) : "", known(D.preds) ? cls(D.preds[i]) : ""].join(" ").toLowerCase();
        if (!text.includes(q)) continue;
      }
      view.push(i);
    }
    window.HVSite.sortView(view, sortKey(), state.dir);
  }

  // ------------------------------------------------------------------ the grid
  function metricText(m, i) {
    const out = [];
    if (m.targets && m.targets[i] >= 0) out.push(el("span", { textContent: "target " + cls(m.targets[i]) + (m.scores && m.scores[i] !== null ? ", score " + fmt(m.scores[i], 2) : "") }));
    for (const name of D.metrics) if (m.metrics[name]) out.push(el("span", { textContent: name + ": " + fmt(m.metrics[name][i]) }));
    return el("div", { className: "metrics" }, ...out);
  }
  // one thumbnail: a tile of its sprite sheet (SPRITE items side by side in one PNG), loaded when it scrolls into view
  function tile(folder, i, alt) {
    const img = el("img", { src: folder + "/" + Math.floor(i / D.sprite) + ".png", alt, width: D.thumb[1], height: D.thumb[0], loading: "lazy", decoding: "async" });
    img.className = "tile";
    img.style.objectPosition = -(i % D.sprite) * D.thumb[1] + "px 0";
    return img;
  }
  function row(i) {
    const tr = el("tr", { tabIndex: 0 });
    tr.dataset.item = i;
    const label = known(D.labels) ? cls(D.labels[i]) : null;
    const alt = "image " + D.names[i] + (label ? ", a " + label : "");
    const img = tile("img", i, alt);
    const ok = correct(i);
    const info = el("td", {},
      el("div", { className: "item-name", textContent: D.names[i] }),
      el("div", { textContent: "label: " + (label ?? "—") }),
      el("div", { className: ok === null ? "" : ok ? "right" : "wrong", textContent: "prediction: " + (known(D.preds) ? cls(D.preds[i]) : "—") + (known(D.probs) ? " (" + fmt(D.probs[i], 2) + ")" : "") + (ok === false ? " ✗" : ok ? " ✓" : "") }));
    tr.append(el("td", {}, img), info);
    D.methods.forEach((m, j) => {
      const label = m.name + " map of " + D.names[i] + (m.targets && m.targets[i] >= 0 ? " for " + cls(m.targets[i]) : "");
      const t = m.folder ? tile(m.folder, i, label) : mapTile(j, i, label);
      tr.append(el("td", {}, t, metricText(m, i)));
    });
    tr.addEventListener("click", () => detail.open(i));
    return tr;
  }
  function render() {
    compute();
    const pages = Math.max(1, Math.ceil(view.length / PAGE));
    state.page = Math.min(state.page, pages);
    const rows = view.slice((state.page - 1) * PAGE, state.page * PAGE).map(row);
    document.querySelector("#grid tbody").replaceChildren(...rows);
    $("count").textContent = view.length + " of " + D.n + " images" + (pages > 1 ? ", page " + state.page + " of " + pages : "");
    window.HVSite.pager(state, pages, render);
    url.write();
  }
  function setupControls() {
    $("source").textContent = D.source;
    const head = el("tr", {}, el("th", { scope: "col", textContent: "image" }), el("th", { scope: "col", textContent: "label / prediction" }));
    D.methods.forEach((m) => head.append(el("th", { scope: "col", textContent: m.name })));
    document.querySelector("#grid thead").append(head);
    if (D.classes || known(D.labels)) {
      const seen = known(D.labels) ? [...new Set(D.labels)].sort((a, b) => a - b) : D.classes.map((_, k) => k);
      for (const k of seen) $("cls").append(el("option", { value: String(k), textContent: cls(k) }));
    } else $("cls").disabled = true;
    if (!(known(D.labels) && known(D.preds))) $("ok").disabled = true;
    const sort = $("sort");
    sort.append(el("option", { value: "index", textContent: "data set order" }), el("option", { value: "name", textContent: "name" }));
    if (known(D.probs)) sort.append(el("option", { value: "prob", textContent: "probability" }));
    const fm = $("fm");
    D.methods.forEach((m, j) => {
      for (const name of D.metrics) if (m.metrics[name]) {
        for (const s of [sort, fm]) s.append(el("option", { value: "m|" + j + "|" + name, textContent: m.name + ": " + name }));
      }
      if (m.scores && m.scores.some((v) => v !== null)) sort.append(el("option", { value: "s|" + j, textContent: m.name + ": target score" }));
    });
    if (!fm.options.length) fm.closest(".metric-filter").hidden = true;
    const ids = ["q", "cls", "ok", "sort", "dir", "fm", "fop", "fv"];
    const sync = () => { for (const k of ids) $(k).value = state[k]; if (!fm.value && fm.options.length) fm.selectedIndex = 0; };
    sync();
    for (const k of ids) $(k).addEventListener(k === "q" || k === "fv" ? "input" : "change", () => {
      state[k] = $(k).value;
      if (k === "fop" || k === "fv") state.fm = fm.value;
      state.page = 1; render();
    });
    window.addEventListener("hashchange", () => { url.read(); sync(); render(); state.item !== "" ? openDetail(+state.item) : detail.close(); });
  }

  // ------------------------------------------------------------------ the detail view
  function options(m) {
    const mode = $("d-mode").value || m.mode, sign = $("d-sign").value || m.sign;
    const ov = $("d-overlay").value;
    return { mode, sign, scale: $("d-scale").value, cmap: $("d-cmap").value || m.cmap, percentile: m.percentile,
      overlay: (ov === "" ? m.overlay : ov === "on") && D.hasImages, alpha: parseFloat($("d-alpha").value) };
  }
  function openDetail(i) {
    if (i >= 0 && i < D.n) detail.open(i);
  }
  async function showDetail(i) {
    const label = known(D.labels) ? cls(D.labels[i]) : "—";
    $("detail-title").textContent = D.names[i] === "#" + i ? "image #" + i : D.names[i] + " (#" + i + ")";
    const info = $("detail-info");
    info.replaceChildren("label: " + label + " · prediction: " + (known(D.preds) ? cls(D.preds[i]) : "—") + (known(D.probs) ? " (" + fmt(D.probs[i], 3) + ")" : "") + " · ");
    if (D.files) info.append(el("a", { href: D.files[i], textContent: "source file" }));
    else info.append(D.source);
    $("detail-title").focus();
    const records = await loadMaps(Math.floor(i / D.block));
    if (detail.current !== i) return;
    drawDetail(i, records);
  }
  function drawDetail(i, records) {
    const [H, W] = D.full;
    // the image: its own file when larger than a thumbnail, else its tile of the sheet, drawn on a canvas
    const base = new Image();
    base.src = D.hasFull ? "full/" + i + ".png" : "img/" + Math.floor(i / D.sprite) + ".png";
    const region = D.hasFull ? [0, 0, W, H] : [(i % D.sprite) * D.thumb[1], 0, D.thumb[1], D.thumb[0]];
    const paint = (ctx) => ctx.drawImage(base, ...region, 0, 0, W, H);
    const whenLoaded = (f) => (base.complete && base.naturalWidth ? f() : base.addEventListener("load", f));
    const picture = el("canvas", { width: W, height: H });
    picture.setAttribute("role", "img");
    picture.setAttribute("aria-label", "image " + D.names[i]);
    whenLoaded(() => { paint(picture.getContext("2d")); picture.dataset.loaded = "1"; });
    const figs = [el("figure", {}, picture, el("figcaption", { textContent: "image, " + W + "×" + H }))];
    const raws = D.methods.map((m, j) => rawMap(records, j, i));
    // one option set per method; "shared" scale pools the maps whose options agree (all of them unless overridden)
    const opts = D.methods.map(options);
    const groups = {};
    D.methods.forEach((m, j) => { const key = opts[j].scale === "shared" ? JSON.stringify([opts[j].mode, opts[j].sign, opts[j].percentile]) : "own" + j; (groups[key] = groups[key] || []).push(j); });
    const normed = new Array(D.methods.length);
    for (const js of Object.values(groups)) {
      const out = normalizeMaps(js.map((j) => raws[j].values), opts[js[0]]);
      js.forEach((j, k) => { normed[j] = out[k]; });
    }
    D.methods.forEach((m, j) => {
      const o = opts[j], [c, h, w] = raws[j].shape, v = normed[j];
      const canvas = el("canvas", { width: W, height: H });
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", m.name + " map of " + D.names[i] + ", " + o.mode + " mode, " + o.sign + " sign, " + o.scale + " scale" + (o.overlay ? ", over the image" : ""));
      const px = new ImageData(W, H), table = lut(o.cmap);
      const planes = [];
      for (let ch = 0; ch < c; ch++) planes.push(resize(v.subarray(ch * h * w, (ch + 1) * h * w), h, w, H, W));
      for (let q = 0; q < H * W; q++) {
        if (c === 3) for (let ch = 0; ch < 3; ch++) px.data[4 * q + ch] = Math.round(planes[ch][q] * 255);
        else { const idx = Math.min(255, Math.floor(Math.min(1, Math.max(0, planes[0][q])) * 256)); for (let ch = 0; ch < 3; ch++) px.data[4 * q + ch] = table[3 * idx + ch]; }
        px.data[4 * q + 3] = o.overlay ? Math.round(o.alpha * 255) : 255;
      }
      const ctx = canvas.getContext("2d");
      if (o.overlay) {
        const layer = el("canvas", { width: W, height: H });
        layer.getContext("2d").putImageData(px, 0, 0);
        whenLoaded(() => { ctx.clearRect(0, 0, W, H); paint(ctx); ctx.drawImage(layer, 0, 0); });
      } else ctx.putImageData(px, 0, 0);
      const cap = el("figcaption", {}, el("strong", { textContent: m.name }), " · " + o.mode + ", " + o.sign + ", " + o.cmap);
      cap.append(metricText(m, i));
      figs.push(el("figure", {}, canvas, cap));
    });
    $("detail-maps").replaceChildren(...figs);
    $("detail-maps").dataset.drawn = String(i);
  }
  const detail = window.HVSite.detail(state, url, showDetail, () => view);
  function redraw() {
    const i = detail.current;
    if (i !== null) loadMaps(Math.floor(i / D.block)).then((records) => { if (detail.current === i) drawDetail(i, records); });
  }

  function start() {
    for (const name of Object.keys(D.luts)) $("d-cmap").append(el("option", { value: name, textContent: name }));
    for (const id of ["d-mode", "d-sign", "d-scale", "d-cmap", "d-overlay", "d-alpha"]) $(id).addEventListener("input", redraw);
    url.read();
    setupControls();
    render();
    if (state.item !== "") openDetail(+state.item);
    document.body.dataset.ready = "1";
  }
  start();
})();
