// hookviz reports: what the pages of both reports share (the image report's report.js and the generation report's
// generation.js): DOM helpers, the view's state in the URL fragment, sorting with unknown values last, the pager,
// data files loaded as script tags (file:// pages may load scripts but not fetch files), deflated data inflated by
// the browser, the keys of the list and the detail view's open / close / step. Text is set with textContent only.
"use strict";
window.HVSite = (function () {
  const $ = (id) => document.getElementById(id);
  const el = (tag, props, ...kids) => {
    const e = document.createElement(tag);
    Object.assign(e, props || {});
    for (const k of kids) e.append(k);
    return e;
  };
  const fmt = (v, d = 3) => (v === null || v === undefined ? "—" : Number(v).toFixed(d));

  // the state's entries that differ from `defaults` (or from "") live in the fragment: #q=cat&sort=...&item=3
  function urlState(state, defaults) {
    return {
      read() {
        const p = new URLSearchParams(location.hash.slice(1));
        for (const k of Object.keys(state)) if (p.has(k)) state[k] = k === "page" ? Math.max(1, parseInt(p.get(k), 10) || 1) : p.get(k);
      },
      write() {
        const p = new URLSearchParams();
        for (const [k, v] of Object.entries(state)) if (v !== "" && v !== defaults[k]) p.set(k, v);
        const h = "#" + p.toString();
        if (location.hash !== h) history.replaceState(null, "", h === "#" ? location.pathname + location.search : h);
      },
    };
  }

  // `view` (item indices) sorted by key[i] (null: unknown, last whatever the order), ties by index; no key: the
  // items' own order, reversed for "desc"
  function sortView(view, key, dir) {
    const sgn = dir === "desc" ? -1 : 1;
    if (key) {
      view.sort((a, b) => {
        const x = key[a], y = key[b];
        if (x === null && y === null) return a - b;
        if (x === null) return 1;
        if (y === null) return -1;
        return (x < y ? -1 : x > y ? 1 : a - b) * sgn;
      });
    } else if (sgn < 0) view.reverse();
    return view;
  }

  // the page buttons of every nav.pager: previous, first, last, the current page and two either side, next
  function pager(state, pages, render) {
    for (const nav of document.querySelectorAll(".pager")) {
      nav.replaceChildren();
      const add = (p, text) => {
        const b = el("button", { type: "button", textContent: text || String(p) });
        if (p === state.page && !text) b.setAttribute("aria-current", "page");
        b.disabled = p < 1 || p > pages || (text && p === state.page);
        b.addEventListener("click", () => { state.page = p; render(); document.querySelector("#grid tbody tr")?.focus(); });
        nav.append(b);
      };
      add(state.page - 1, "‹ previous");
      const shown = new Set([1, pages, state.page - 2, state.page - 1, state.page, state.page + 1, state.page + 2]);
      let last = 0;
      for (const p of [...shown].filter((p) => p >= 1 && p <= pages).sort((a, b) => a - b)) {
        if (p > last + 1) nav.append(el("span", { textContent: "…" }));
        add(p); last = p;
      }
      add(state.page + 1, "next ›");
    }
  }

  // data files `folder/NNNNN.js`, each calling window.HV[callback](block, data); one promise per block
  function scriptBlocks(folder, callback) {
    const blocks = {}, waiting = {};
    window.HV = window.HV || {};
    window.HV[callback] = function (block, data) { blocks[block] = data; (waiting[block] || []).forEach((f) => f()); delete waiting[block]; };
    return function load(block) {
      return new Promise((resolve, reject) => {
        if (blocks[block]) return resolve(blocks[block]);
        (waiting[block] = waiting[block] || []).push(() => resolve(blocks[block]));
        if (waiting[block].length > 1) return;
        const s = document.createElement("script");
        s.src = folder + "/" + String(block).padStart(5, "0") + ".js";
        s.onerror = () => reject(new Error("cannot load " + s.src));
        document.head.append(s);
      });
    };
  }
  // base64 of zlib data -> its bytes, inflated by the browser (no fetch: a Blob's stream, so file:// is fine)
  async function inflate(b64) {
    const text = atob(b64), bytes = new Uint8Array(text.length);
    for (let q = 0; q < text.length; q++) bytes[q] = text.charCodeAt(q);
    return new Uint8Array(await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"))).arrayBuffer());
  }

  // the detail view (#detail) over the list's rows: opened on an item, closed with focus back on its row, stepped
  // through the filtered list; `show(i)` fills it, `view()` is the list's current order
  function detail(state, url, show, view) {
    let current = null, returnFocus = null;
    const d = {
      get current() { return current; },
      open(i) {
        if ($("detail").hidden) returnFocus = i;
        current = i; state.item = String(i); url.write();
        $("detail").hidden = false;
        show(i);
      },
      close() {
        if ($("detail").hidden) return;
        $("detail").hidden = true;
        state.item = ""; current = null; url.write();
        const back = document.querySelector('#grid tbody tr[data-item="' + returnFocus + '"]');
        if (back) back.focus();
      },
      step(k) {
        const at = view().indexOf(current), next = view()[at + k];
        if (at >= 0 && next !== undefined) d.open(next);
      },
    };
    $("close").addEventListener("click", d.close);
    $("prev").addEventListener("click", () => d.step(-1));
    $("next").addEventListener("click", () => d.step(1));
    // keys: in the list ↑/↓ (k/j) move, Enter opens; in the detail view Esc closes, ←/→ step
    document.addEventListener("keydown", (ev) => {
      if (!$("detail").hidden) {
        if (ev.key === "Escape") { ev.preventDefault(); d.close(); }
        else if (ev.target.tagName !== "SELECT" && ev.target.tagName !== "INPUT" && (ev.key === "ArrowLeft" || ev.key === "ArrowRight")) { ev.preventDefault(); d.step(ev.key === "ArrowLeft" ? -1 : 1); }
        return;
      }
      const tr = ev.target.closest && ev.target.closest("#grid tbody tr");
      if (!tr) return;
      if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); d.open(+tr.dataset.item); }
      else if (ev.key === "ArrowDown" || ev.key === "j") { ev.preventDefault(); (tr.nextElementSibling || tr).focus(); }
      else if (ev.key === "ArrowUp" || ev.key === "k") { ev.preventDefault(); (tr.previousElementSibling || tr).focus(); }
    });
    return d;
  }

  return { $, el, fmt, urlState, sortView, pager, scriptBlocks, inflate, detail };
})();
