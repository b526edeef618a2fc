// attnlab explorer: asks /api/run for each served run and draws what comes back. Hand-written,
// no library: every heatmap is a canvas, every text goes in through textContent.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);
const panels = [];  // one per run: {index, run, root, result, off: {module: Set}, choice, step, module, head}
let upload = "";  // the chosen file's bytes in base64, for runs that read images or recordings
let uploading = Promise.resolve();  // its reading, which a submit waits for

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;  // through the CSSOM: the page's CSP refuses style attributes
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

const fixed = (x, digits = 4) => x.toFixed(digits);
const shade = (p) => {  // 0 -> white, 1 -> dark blue
  const mix = (a, b) => Math.round(a + (b - a) * Math.min(1, Math.max(0, p)));
  return `rgb(${mix(255, 8)},${mix(255, 48)},${mix(255, 107)})`;
};
const ink = (p) => (p > 0.55 ? "#fff" : "#1d2330");

async function start() {
  const reply = await fetch("/api/info");
  const info = await reply.json();
  $("#runs").textContent = info.runs.map((r) => `${r.name}: ${r.arch}, ${r.task}`).join("  |  ");
  const image = info.runs.some((r) => r.input === "image"), audio = info.runs.some((r) => r.input === "audio");
  $("#text").placeholder = audio ? "an audio file's path on the server, or upload one"
    : image ? "an image file's path on the server, or upload one" : "a sentence to read";
  $("#text").required = !(image || audio);
  $("#upload").hidden = !(image || audio);
  $("#upload").accept = audio ? "audio/*" : "image/*";
  const asks = info.runs.some((r) => "question" in r.options);  // a question answerer: a question as well
  $("#question").hidden = !asks;
  $("#question").required = asks;
  $("#upload").addEventListener("change", () => { uploading = readUpload(); });
  $("#text").addEventListener("input", () => { if ($("#text").value) { $("#upload").value = ""; upload = ""; } });
  const example = info.runs.map((r) => r.example).find((e) => e);  // from the first run's validation data
  if (example) $("#text").value = example;  // the field is still disabled: nothing typed is overwritten
  addOptions(info.runs);
  $("#panels").style.gridTemplateColumns = `repeat(${info.runs.length}, minmax(0, 1fr))`;
  info.runs.forEach((run, index) => {
    const root = el("section", {class: "panel", "data-run": index, "data-state": "idle", "data-answers": 0});
    $("#panels").append(root);
    panels.push({index, run, root, result: null, off: {}, choice: 0, step: 0, module: "all", head: "all"});
    root.append(header(run));
  });
  $("#ask").addEventListener("submit", async (event) => {
    event.preventDefault();
    await uploading;
    for (const panel of panels) Object.assign(panel, {choice: 0, step: 0});
    panels.forEach(ask);
  });
  // Only now, with the example written and the handler above in place, does the form take input
  // (index.html disables it): text typed earlier could meet the example (a fill that selected the
  // empty field, then inserted its text after the example, sent both), and Run would submit natively.
  $("#text").disabled = $("#ask button[type=submit]").disabled = false;
}

async function readUpload() {  // the file as base64 (a data URL's payload); the path field then empty
  const file = $("#upload").files[0];
  upload = "";
  if (!file) return;
  const url = await new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
  upload = url.slice(url.indexOf(",") + 1);
  $("#text").value = "";
}

// -- the form: the options of every served run's task -------------------------------------------
const LABELS = {beam: "beam", lenpen: "length penalty", max_new_tokens: "new tokens", sample: "sample",
                temperature: "temperature", seed: "seed"};

function addOptions(runs) {
  const defaults = Object.assign({}, ...runs.map((r) => r.options));
  delete defaults.hypothesis;  // chosen by clicking an output
  delete defaults.image;  // the uploaded file
  delete defaults.audio;  // the uploaded recording
  delete defaults.question;  // its own field
  for (const [name, value] of Object.entries(defaults)) {
    const input = typeof value === "boolean"
      ? el("input", {type: "checkbox", name})
      : el("input", {type: "number", name, value, step: Number.isInteger(value) ? 1 : 0.1});
    $("#options").append(el("label", {}, `${LABELS[name] ?? name.replaceAll("_", " ")} `, input));
  }
}

function requestFor(panel) {
  const body = {run: panel.index, text: $("#text").value, heads_off: {}};
  for (const [module, heads] of Object.entries(panel.off)) if (heads.size) body.heads_off[module] = [...heads];
  for (const [name, value] of Object.entries(panel.run.options)) {
    const input = $(`#options [name=${name}]`);
    if (name === "hypothesis") body.hypothesis = panel.choice;
    else if (name === "image" || name === "audio") body[name] = upload;
    else if (name === "question") body.question = $("#question").value;
    else if (typeof value === "boolean") body[name] = input.checked;
    else body[name] = Number(input.value);
  }
  return body;
}

async function ask(panel) {
  panel.root.dataset.state = "busy";
  let reply, answer;
  try {
    reply = await fetch("/api/run", {method: "POST", headers: {"Content-Type": "application/json"},
                                     body: JSON.stringify(requestFor(panel))});
    answer = await reply.json();
  } catch (err) {
    answer = {error: `no answer from the server (${err.message})`};
  }
  panel.root.dataset.answers = Number(panel.root.dataset.answers) + 1;
  if (!reply || !reply.ok) {
    panel.root.replaceChildren(header(panel.run), el("p", {class: "error", role: "alert"}, answer.error));
    panel.root.dataset.state = "error";
    return;
  }
  panel.result = answer;
  panel.choice = answer.chosen ?? 0;
  render(panel);
  panel.root.dataset.state = "ready";
}

// -- one run's column -----------------------------------------------------------------------------
function header(run) {
  const parts = [el("h2", {}, run.name), el("div", {class: "meta"}, `${run.arch} · ${run.task} · ${run.path}`)];
  if (run.pruning) parts.push(pruningReport(run.pruning));
  return el("div", {class: "run"}, ...parts);
}

function pruningReport(report) {
  const heads = Object.entries(report.pruned_heads).map(([m, hs]) => `${m}: ${hs.join(", ")}`);
  const measured = Object.entries(report)
    .filter(([k, v]) => typeof v === "number" && !["heads_pruned", "heads_total", "fraction"].includes(k))
    .map(([k, v]) => `${k} ${Number.isInteger(v) ? v : fixed(v)}`);
  return el("details", {class: "pruning", open: ""},
    el("summary", {}, `pruned: ${report.heads_pruned} of ${report.heads_total} heads cut out` +
                      (report.pruned_from ? ` of ${report.pruned_from}` : "")),
    el("div", {}, heads.join("; ")), el("div", {class: "meta"}, measured.join(" · ")));
}

function render(panel) {
  const result = panel.result;
  const parts = [header(panel.run), el("h3", {}, "Output"), outputs(panel)];
  if (result.steps && result.steps.length) parts.push(el("h3", {}, "Step through the output"), steps(panel));
  if (result.text_to_image) parts.push(el("h3", {}, "Where each word of the question looks in the image"), words(panel));
  if (result.summary) parts.push(el("h3", {}, "What the summary attends to, on the spectrogram"), summaries(panel));
  parts.push(el("h3", {}, "Heads: mean entropy (nats) · click to switch a head off"), entropyTable(panel));
  parts.push(filters(panel), ...result.attention.map((map) => moduleMaps(panel, map)));
  panel.root.replaceChildren(...parts);
}

// how the outputs are drawn is the run's page's (its task's view on the server: /api/info's "output")
function outputs(panel) {
  const outs = panel.result.outputs, kind = panel.run.output;
  if (kind === "nbest") {
    return el("ol", {class: "nbest", start: 0}, ...outs.map((o, i) => el("li",
      {class: i === panel.choice ? "chosen" : "", "data-index": i,
       onclick: () => { panel.choice = i; panel.step = 0; ask(panel); }},
      el("span", {class: "text"}, o.text || "(empty)"),
      el("span", {class: "score"}, `score ${fixed(o.score)}`),
      el("span", {class: "logprob"}, `log P ${fixed(o.logprob)}`))));
  }
  if (kind === "continuation") {
    const o = outs[0];
    return el("p", {class: "continuation"}, el("span", {class: "prompt"}, $("#text").value),
              el("span", {class: "generated"}, o.text),
              el("span", {class: "logprob"}, `log P ${fixed(o.logprob)} over ${o.tokens.length} tokens`));
  }
  if (!outs.length) return el("p", {class: "meta"}, "attention only (a masked LM predicts no output here)");
  return el("table", {class: "classes"}, ...outs.map((o) => el("tr", {},
    el("td", {}, o.label), el("td", {style: "width: 12em"}, el("div", {class: "bar", style: `width: ${100 * o.probability}%`})),
    el("td", {class: "probability"}, fixed(o.probability)))));
}

// -- stepping through a decoded output: its tokens, each one's log P, and what it attended to ------
// the row of ``map`` that the current step reads (/api/info's "steps"); -1: none
function stepRow(panel, map) {
  const steps = panel.run.steps;
  if (steps === "decoder") return map.stack === "decoder" ? panel.step : -1;
  // a continuation: the prompt's last position predicts the first step's token
  if (steps === "continuation") return panel.result.prompt_tokens.length - 1 + panel.step;
  if (steps === "question") return panel.step;  // the chosen word: the question comes first in the joint sequence
  return -1;
}

function steps(panel) {
  const list = panel.result.steps;
  const go = (t) => { panel.step = Math.max(0, Math.min(list.length - 1, t)); render(panel); };
  const chips = list.map((s, t) => el("span", {class: `tok${t === panel.step ? " current" : ""}`, "data-step": t,
                                               onclick: () => go(t)}, s.token));
  const now = list[panel.step];
  const sofar = list.slice(0, panel.step + 1).reduce((sum, s) => sum + s.logprob, 0);
  const detail = el("div", {class: "step meta"},
    `step ${panel.step + 1}/${list.length}: “${now.token}”, log P ${fixed(now.logprob)} (${fixed(sofar)} so far)`);
  const cross = panel.result.attention.filter((m) => m.kind === "cross");
  const looked = cross.length ? cross : panel.result.attention.slice(-1);  // an LM: its last layer
  return el("div", {}, el("div", {class: "tokens"}, el("button", {type: "button", onclick: () => go(panel.step - 1)}, "◀"),
                          ...chips, el("button", {type: "button", onclick: () => go(panel.step + 1)}, "▶")),
            detail, ...looked.map((map) => panel.result.picture ? onImage(panel, map) : alignment(panel, map)));
}

// a question answerer: the chosen word's (or the [CLS]'s) text-to-image attention, layer by layer
function words(panel) {
  const {question_tokens: list, text_to_image: maps} = panel.result;
  const chips = list.map((w, t) => el("span", {class: `tok${t === panel.step ? " current" : ""}`, "data-step": t,
                                               onclick: () => { panel.step = t; render(panel); }}, w));
  const drawn = maps.filter((map) => map.cols.length);  // none: the text-only baseline reads no patches
  return el("div", {}, el("div", {class: "tokens"}, ...chips), ...drawn.map((map) => onImage(panel, map)));
}

// a captioner: the step's word's cross-attention over the patch grid, on the picture the model read
// (and a question answerer: a word's text-to-image block)
function onImage(panel, map) {
  const row = stepRow(panel, map);
  const off = panel.off[map.module] || new Set();
  const heads = map.probs.map((_, h) => h).filter((h) => !off.has(h));
  const mean = map.cols.map((_, j) => heads.reduce((s, h) => s + map.probs[h][row][j], 0) / Math.max(1, heads.length));
  const figure = (weights, caption, head) => {
    const canvas = el("canvas", {class: "patches", "data-module": map.module, "data-head": head});
    drawOnImage(canvas, panel.result.picture, panel.result.grid, weights);
    return el("figure", {}, canvas, el("figcaption", {}, caption));
  };
  return el("div", {class: "module"}, el("div", {class: "meta"}, `${label(map)}: “${map.rows[row]}” over the patches`),
    el("div", {class: "maps"}, figure(mean, "heads on, averaged", "mean"),
       ...map.probs.map((probs, h) => figure(probs[row], `head ${h}${off.has(h) ? " (off)" : ""}`, h))));
}

// a classifier of sound: each layer's summary (its class token, or the tokens' mean) over the tokens that
// tile the spectrogram, drawn on it: the heads on, averaged, then each head
function summaries(panel) {
  return el("div", {}, ...panel.result.summary.map(({module, probs}) => {
    const off = panel.off[module] || new Set();
    const heads = probs.map((_, h) => h).filter((h) => !off.has(h));
    const mean = probs[0].map((_, j) => heads.reduce((s, h) => s + probs[h][j], 0) / Math.max(1, heads.length));
    const figure = (weights, caption, head) => {
      const canvas = el("canvas", {class: "patches", "data-module": module, "data-head": head});
      drawOnImage(canvas, panel.result.picture, panel.result.grid, weights);
      return el("figure", {}, canvas, el("figcaption", {}, caption));
    };
    return el("div", {class: "module"}, el("div", {class: "meta"}, module),
      el("div", {class: "maps"}, figure(mean, "heads on, averaged", "mean"),
         ...probs.map((weights, h) => figure(weights, `head ${h}${off.has(h) ? " (off)" : ""}`, h))));
  }));
}

function drawOnImage(canvas, picture, [rows, cols], weights) {  // picture (H, W, C) in [0, 1]; weights (rows * cols)
  const H = picture.length, W = picture[0].length, scale = Math.max(1, Math.floor(128 / Math.max(H, W)));
  const most = Math.max(...weights, 1e-9);
  canvas.width = W * scale;
  canvas.height = H * scale;
  const ctx = canvas.getContext("2d");
  picture.forEach((line, y) => line.forEach((pixel, x) => {
    const grey = 255 * pixel.reduce((a, b) => a + b, 0) / pixel.length;
    const p = 0.75 * weights[Math.floor(y * rows / H) * cols + Math.floor(x * cols / W)] / most;  // as inferno's warm end
    ctx.fillStyle = `rgb(${Math.round(grey * (1 - p) + 252 * p)},${Math.round(grey * (1 - p) + 160 * p)},${Math.round(grey * (1 - p) + 40 * p)})`;
    ctx.fillRect(x * scale, y * scale, scale, scale);
  }));
}

function alignment(panel, map) {
  const row = stepRow(panel, map);
  const off = panel.off[map.module] || new Set();
  const heads = map.probs.map((_, h) => h).filter((h) => !off.has(h));
  const mean = map.cols.map((_, j) => heads.reduce((s, h) => s + map.probs[h][row][j], 0) / Math.max(1, heads.length));
  return el("div", {class: "align"}, el("span", {class: "name"}, `${label(map)} (heads on, averaged):`),
    ...map.cols.map((c, j) => el("span", {class: "w", title: fixed(mean[j]),
                                           style: `background: ${shade(mean[j])}; color: ${ink(mean[j])}`}, c)));
}

// -- heads: entropy overview and switches -----------------------------------------------------------
const label = (map) => `${map.stack} ${map.layer} ${map.kind}`;

function entropyTable(panel) {
  const rows = panel.result.attention.map((map) => {
    const maskable = map.module in panel.run.modules;
    const off = panel.off[map.module] || new Set();
    return el("tr", {}, el("th", {title: map.module}, label(map)), ...map.entropy.map((e, h) => {
      const focus = 1 - e / map.uniform_entropy;  // 1: one key, 0: uniform
      const attrs = {type: "button", class: `head${off.has(h) ? " off" : ""}`, "data-module": map.module, "data-head": h,
                     style: `background: ${shade(focus)}; color: ${ink(focus)}`,
                     title: `${map.module} head ${h}: entropy ${fixed(e, 3)} nats (uniform ${fixed(map.uniform_entropy, 3)})`};
      if (maskable) attrs.onclick = () => toggle(panel, map.module, h);
      else attrs.disabled = "";
      return el("td", {}, el("button", attrs, `h${h} ${fixed(e, 2)}`));
    }));
  });
  return el("table", {class: "entropy"}, ...rows);
}

function toggle(panel, module, head) {
  const off = (panel.off[module] ||= new Set());
  off.has(head) ? off.delete(head) : off.add(head);
  ask(panel);
}

// -- heatmaps ---------------------------------------------------------------------------------------
function filters(panel) {
  const maps = panel.result.attention;
  const most = Math.max(...maps.map((m) => m.probs.length));
  const choose = (key, values, names) => el("select", {"data-filter": key, onchange: (e) => {
    panel[key] = e.target.value; render(panel);
  }}, ...values.map((v, i) => { const o = el("option", {value: v}, names[i]); o.selected = String(panel[key]) === v; return o; }));
  return el("div", {class: "filters"}, "show ",
    choose("module", ["all", ...maps.map((m) => m.module)], ["every module", ...maps.map(label)]),
    choose("head", ["all", ...Array.from({length: most}, (_, h) => String(h))],
           ["every head", ...Array.from({length: most}, (_, h) => `head ${h}`)]));
}

function moduleMaps(panel, map) {
  const shown = panel.module === "all" || panel.module === map.module;
  const off = panel.off[map.module] || new Set();
  const figures = map.probs.map((probs, h) => {
    if (panel.head !== "all" && Number(panel.head) !== h) return null;
    const canvas = el("canvas", {class: "heatmap", "data-module": map.module, "data-head": h});
    draw(canvas, probs, map.rows, map.cols, stepRow(panel, map));
    return el("figure", {class: off.has(h) ? "off" : ""}, canvas,
              el("figcaption", {}, `head ${h}${off.has(h) ? " (off)" : ""} · entropy ${fixed(map.entropy[h], 2)}`));
  }).filter(Boolean);
  const box = el("div", {class: "module"}, el("h3", {}, `${label(map)} · ${map.module}`), el("div", {class: "maps"}, ...figures));
  box.hidden = !shown;
  return box;
}

function draw(canvas, probs, rows, cols, highlight) {
  const ctx = canvas.getContext("2d");
  const font = "11px monospace";
  ctx.font = font;
  const width = (labels) => Math.ceil(Math.max(...labels.map((t) => ctx.measureText(t).width)));
  const cell = Math.max(6, Math.min(18, Math.floor(260 / Math.max(rows.length, cols.length))));
  const left = width(rows) + 6, top = width(cols) + 6;
  canvas.width = left + cell * cols.length + 2;
  canvas.height = top + cell * rows.length + 2;
  ctx.font = font;
  ctx.fillStyle = "#1d2330";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  rows.forEach((t, i) => ctx.fillText(t, left - 4, top + cell * (i + 0.5)));
  ctx.textAlign = "left";
  cols.forEach((t, j) => {
    ctx.save();
    ctx.translate(left + cell * (j + 0.5), top - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(t, 0, 0);
    ctx.restore();
  });
  probs.forEach((row, i) => row.forEach((p, j) => {
    ctx.fillStyle = shade(p);
    ctx.fillRect(left + cell * j, top + cell * i, cell, cell);
  }));
  if (highlight >= 0 && highlight < rows.length) {
    ctx.strokeStyle = "#d62728";
    ctx.lineWidth = 2;
    ctx.strokeRect(left, top + cell * highlight, cell * cols.length, cell);
  }
  canvas.addEventListener("mousemove", (event) => {
    const box = canvas.getBoundingClientRect();
    const j = Math.floor((event.clientX - box.left - left) / cell), i = Math.floor((event.clientY - box.top - top) / cell);
    const tip = $("#tip");
    tip.hidden = !(i >= 0 && i < rows.length && j >= 0 && j < cols.length);
    if (tip.hidden) return;
    tip.textContent = `${rows[i]} → ${cols[j]}: ${fixed(probs[i][j])}`;
    tip.style.left = `${event.pageX + 12}px`;
    tip.style.top = `${event.pageY + 12}px`;
  });
  canvas.addEventListener("mouseleave", () => { $("#tip").hidden = true; });
}

start().catch((err) => { const box = $("#error"); box.textContent = `cannot start: ${err.message}`; box.hidden = false; });
