// The report's own script: draws the charts (SVG) and the sample list from the page's JSON data.
// Every recorded text is set with textContent, never parsed as HTML; the page's policy lets only
// this script run. Chart kinds: "line" (step or plain lines, optional markers), "bars" (stacked),
// "gantt" (horizontal segments per row).
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var M = { l: 64, r: 16, t: 12, b: 40 };

  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, parent, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "-";
    var a = Math.abs(v);
    return a !== 0 && (a < 0.01 || a >= 1e5) ? v.toExponential(2) : String(Math.round(v * 1000) / 1000);
  }
  function ticks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    var err = (hi - lo) / n / step;
    step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.round(v / step) * step);
    return out;
  }
  function extent(series, key, lo0) {
    var lo = lo0 === undefined ? Infinity : lo0, hi = -Infinity;
    series.forEach(function (s) {
      if (s.off) return;
      (s[key] || []).forEach(function (v, i) {
        if (v === null) return;
        var w = key === "x" && s.w ? v + s.w[i] : v;
        if (v < lo) lo = v;
        if (w > hi) hi = w;
      });
    });
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (hi <= lo) hi = lo + 1;
    return [lo, hi];
  }
  function axes(svg, W, H, xr, yr, c, cats) {
    var g = el("g", { "class": "axes", "font-size": "11", fill: "#444" }, svg);
    var X = function (v) { return M.l + (v - xr[0]) / (xr[1] - xr[0]) * (W - M.l - M.r); };
    var Y = function (v) { return H - M.b - (v - yr[0]) / (yr[1] - yr[0]) * (H - M.t - M.b); };
    el("rect", { x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b, fill: "none", stroke: "#ccc" }, g);
    if (!cats) ticks(xr[0], xr[1], 8).forEach(function (v) {
      var name = c.xticks ? c.xticks[v] : fmt(v);  // named positions (e.g. the runs of a suite)
      if (name === undefined) return;
      el("line", { x1: X(v), x2: X(v), y1: M.t, y2: H - M.b, stroke: "#eee" }, g);
      el("text", { x: X(v), y: H - M.b + 14, "text-anchor": "middle" }, g, name);
    });
    if (!c.rows) ticks(yr[0], yr[1], 5).forEach(function (v) {
      el("line", { x1: M.l, x2: W - M.r, y1: Y(v), y2: Y(v), stroke: "#eee" }, g);
      el("text", { x: M.l - 6, y: Y(v) + 4, "text-anchor": "end" }, g, fmt(v));
    });
    if (c.xlabel) el("text", { x: (W + M.l) / 2, y: H - 6, "text-anchor": "middle" }, g, c.xlabel);
    if (c.ylabel) el("text", { x: 12, y: (H - M.b + M.t) / 2, "text-anchor": "middle",
                               transform: "rotate(-90 12 " + (H - M.b + M.t) / 2 + ")" }, g, c.ylabel);
    return { X: X, Y: Y };
  }
  function linePath(s, P) {
    var d = [], x = s.x, y = s.y;
    for (var i = 0; i < x.length; i++) {
      if (x[i] === null || y[i] === null) continue;
      var px = P.X(x[i]).toFixed(1), py = P.Y(y[i]).toFixed(1);
      if (!d.length) d.push("M" + px + " " + py);
      else if (s.step) d.push("H" + px + "V" + py);
      else d.push("L" + px + " " + py);
    }
    return d.join("");
  }
  function drawLine(svg, c, W, H) {
    var xr = extent(c.series, "x"), yr = extent(c.series, "y", 0);
    var P = axes(svg, W, H, xr, yr, c);
    c.series.forEach(function (s) {
      if (s.off) return;
      if (s.markers) {
        s.x.forEach(function (v, i) {
          el("path", { d: "M" + (P.X(v) - 5) + " " + (P.Y(s.y[i]) - 5) + "l10 10m0 -10l-10 10",
                       stroke: s.color, "stroke-width": 2, "class": "series" }, svg);
        });
      } else {
        el("path", { d: linePath(s, P), fill: "none", stroke: s.color, "stroke-width": s.width || 2,
                     "class": "series" }, svg);
      }
    });
    return function (mx) {  // hover: each visible series' value at x
      var x = xr[0] + (mx - M.l) / (W - M.l - M.r) * (xr[1] - xr[0]);
      var parts = ["x " + fmt(x)];
      c.series.forEach(function (s) {
        if (s.off || s.markers) return;
        var lo = 0, hi = s.x.length - 1;
        if (hi < 0 || s.x[0] > x) return;
        while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (s.x[mid] <= x) lo = mid; else hi = mid - 1; }
        parts.push(s.name + ": " + fmt(s.y[lo]));
      });
      return parts.join("  |  ");
    };
  }
  function drawBars(svg, c, W, H) {
    var n = c.categories.length, tot = [];
    for (var i = 0; i < n; i++) tot.push(0);
    c.series.forEach(function (s) { if (!s.off) s.y.forEach(function (v, i) { tot[i] += v || 0; }); });
    var P = axes(svg, W, H, [0, n], [0, Math.max.apply(null, tot.concat([1]))], c, true);
    var bw = (W - M.l - M.r) / n * 0.6, base = tot.map(function () { return 0; });
    c.series.forEach(function (s) {
      if (s.off) return;
      var d = [];
      s.y.forEach(function (v, i) {
        var y0 = P.Y(base[i]), y1 = P.Y(base[i] + (v || 0));
        d.push("M" + (P.X(i + 0.5) - bw / 2).toFixed(1) + " " + y0.toFixed(1) + "V" + y1.toFixed(1) + "h" +
               bw.toFixed(1) + "V" + y0.toFixed(1) + "z");
        base[i] += v || 0;
      });
      el("path", { d: d.join(""), fill: s.color, "class": "series bars" }, svg);
    });
    c.categories.forEach(function (name, i) {
      el("text", { x: P.X(i + 0.5), y: H - M.b + 14, "text-anchor": "middle", "font-size": "11" }, svg, name);
    });
    return function (mx) {
      var i = Math.floor((mx - M.l) / (W - M.l - M.r) * n);
      if (i < 0 || i >= n) return "";
      return c.categories[i] + ": " + c.series.filter(function (s) { return !s.off; })
        .map(function (s) { return s.name + " " + fmt(s.y[i]); }).join(", ");
    };
  }
  function drawGantt(svg, c, W, H) {
    var xr = extent(c.series, "x"), rows = c.rows, n = Math.max(rows.length, 1);
    var P = axes(svg, W, H, xr, [0, n], c);
    var rh = (H - M.t - M.b) / n;
    c.series.forEach(function (s) {
      if (s.off) return;
      var d = [];
      for (var i = 0; i < s.x.length; i++) {
        var y = M.t + s.row[i] * rh + rh * 0.1;
        d.push("M" + P.X(s.x[i]).toFixed(1) + " " + y.toFixed(1) + "h" +
               Math.max(0.5, P.X(s.x[i] + s.w[i]) - P.X(s.x[i])).toFixed(1) + "v" + (rh * 0.8).toFixed(1) + "h" +
               (-Math.max(0.5, P.X(s.x[i] + s.w[i]) - P.X(s.x[i]))).toFixed(1) + "z");
      }
      el("path", { d: d.join(""), fill: s.color, "class": "series bars" }, svg);
    });
    return function (mx, my) {
      var r = Math.floor((my - M.t) / rh), x = xr[0] + (mx - M.l) / (W - M.l - M.r) * (xr[1] - xr[0]);
      if (r < 0 || r >= rows.length) return "";
      var parts = [rows[r] + " at " + fmt(x) + " s"];
      c.series.forEach(function (s) {
        if (s.off) return;
        for (var i = 0; i < s.x.length; i++) {
          if (s.row[i] === r && s.x[i] <= x && x <= s.x[i] + s.w[i]) {
            parts.push(s.name + " from " + fmt(s.x[i]) + " s for " + fmt(s.w[i]) + " s");
          }
        }
      });
      return parts.join("  |  ");
    };
  }
  var DRAW = { line: drawLine, bars: drawBars, gantt: drawGantt };

  var WIDTH = null;  // one layout read for every chart: they share the page's width
  function drawChart(div, c) {
    if (WIDTH === null) WIDTH = Math.max((div.clientWidth || 0) - 24, 600);
    div.textContent = "";
    h("div", div, c.title, "chart-title");
    var info = h("div", div, "\u00a0", "chart-hover");
    var W = WIDTH, H = c.height || 340;
    c.series.forEach(function (s) { if (s.off === undefined) s.off = !!s.hidden; });
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, width: "100%", "class": "chart-svg", role: "img" }, div);
    var hover = DRAW[c.kind](svg, c, W, H);
    svg.addEventListener("mousemove", function (ev) {
      var b = svg.getBoundingClientRect(), k = W / b.width;
      info.textContent = hover((ev.clientX - b.left) * k, (ev.clientY - b.top) * k) || "\u00a0";
    });
    var legend = h("div", div, undefined, "legend");
    c.series.forEach(function (s) {
      var item = h("span", legend, undefined, "legend-item" + (s.off ? " off" : ""));
      var sw = h("span", item, "\u25a0 ", "swatch");
      sw.style.color = s.color;
      h("span", item, s.name);
      item.addEventListener("click", function () { s.off = !s.off; drawChart(div, c); });
    });
  }

  // --- the sample list -----------------------------------------------------------------------
  var MAX_ROWS = 500;
  var F = ["batch", "group", "status", "smin", "smax", "dmin", "dmax", "task", "sort"];
  function input(name) { return document.getElementById("f-" + name); }
  function readHash() {
    var m = /^#samples\?(.*)$/.exec(location.hash);
    if (!m) return false;
    m[1].split("&").forEach(function (kv) {
      var p = kv.split("="), e = input(decodeURIComponent(p[0]));
      if (!e || F.indexOf(p[0]) < 0) return;
      var v = decodeURIComponent(p[1] || "");
      e.value = v;
      if (p[0] === "group") e.dataset.want = v;  // its options come with the batch
    });
    return true;
  }
  function writeHash() {
    var q = F.filter(function (k) { return input(k).value !== ""; })
      .map(function (k) { return k + "=" + encodeURIComponent(input(k).value); });
    history.replaceState(null, "", "#samples?" + q.join("&"));
  }
  function fillGroups(b) {
    var sel = input("group"), keep = sel.dataset.want || sel.value;
    delete sel.dataset.want;
    while (sel.options.length > 1) sel.remove(1);
    b.groups.forEach(function (g) { var o = h("option", sel, g); o.value = g; });
    sel.value = b.groups.indexOf(keep) >= 0 ? keep : "";
  }
  function num(name) { var v = input(name).value; return v === "" ? null : Number(v); }
  function matches(b, i, f) {
    var c = b.cols;
    if (f.group !== "" && b.groups[c.group[i]] !== f.group) return false;
    if (f.status === "failed" && c.status[i] !== "failed") return false;
    if (f.status !== "" && f.status !== "failed" && c.status[i] !== f.status) return false;
    if (f.smin !== null && !(c.score[i] !== null && c.score[i] >= f.smin)) return false;
    if (f.smax !== null && !(c.score[i] !== null && c.score[i] <= f.smax)) return false;
    if (f.dmin !== null && !(c.latency[i] !== null && c.latency[i] >= f.dmin)) return false;
    if (f.dmax !== null && !(c.latency[i] !== null && c.latency[i] <= f.dmax)) return false;
    return !(f.task && c.task[i].indexOf(f.task) < 0);
  }
  function sortKey(b, f) {
    var c = b.cols;
    var key = f.sort === "latency" ? function (i) { return -(c.latency[i] || 0); }
      : f.sort === "score" ? function (i) { return c.score[i] === null ? -1 : c.score[i]; }
      : function () { return 0; };
    return function (i, j) { return key(i) - key(j) || c.index[i] - c.index[j]; };  // ties: index order
  }
  function cell(tr, text) { h("td", tr, text === null || text === undefined ? "-" : String(text)); }
  function renderSamples() {
    var b = D.samples[Number(input("batch").value) || 0];
    if (!b) return;
    if (input("group").dataset.batch !== String(b.key)) { fillGroups(b); input("group").dataset.batch = String(b.key); }
    var f = { group: input("group").value, status: input("status").value, smin: num("smin"), smax: num("smax"),
              dmin: num("dmin"), dmax: num("dmax"), task: input("task").value, sort: input("sort").value };
    var hit = [];
    for (var i = 0; i < b.cols.id.length; i++) if (matches(b, i, f)) hit.push(i);
    hit.sort(sortKey(b, f));
    var body = document.querySelector("#sample-table tbody");
    body.textContent = "";
    hit.slice(0, MAX_ROWS).forEach(function (i) {
      var c = b.cols, tr = h("tr", body);
      tr.className = "sample-row " + c.status[i];
      if (b.pages) h("a", h("td", tr), String(c.id[i])).href = b.pages + c.id[i] + ".html";
      else cell(tr, c.id[i]);
      cell(tr, c.index[i]); cell(tr, c.task[i]); cell(tr, b.groups[c.group[i]]); cell(tr, c.status[i]);
      cell(tr, c.score[i]); cell(tr, fmt(c.latency[i])); cell(tr, c.steps[i]); cell(tr, c.retries[i]);
      cell(tr, c.error[i] || "");
    });
    document.getElementById("sample-count").textContent = hit.length + " of " + b.cols.id.length +
      " samples match" + (hit.length > MAX_ROWS ? "; the first " + MAX_ROWS + " are listed (narrow the filter)" : "");
  }
  function initSamples() {
    if (!D.samples || !D.samples.length) return;
    var sel = input("batch");
    D.samples.forEach(function (b, i) { var o = h("option", sel, b.title); o.value = String(i); });
    var fromHash = readHash();
    renderSamples();
    F.forEach(function (k) {
      input(k).addEventListener("input", function () { renderSamples(); writeHash(); });
      input(k).addEventListener("change", function () { renderSamples(); writeHash(); });
    });
    if (fromHash) { renderSamples(); document.getElementById("samples").scrollIntoView(); }
  }

  D.charts.forEach(function (c) {
    var div = document.getElementById(c.id);
    if (div) drawChart(div, c);
  });
  initSamples();
  document.documentElement.setAttribute("data-drawn-ms", String(Math.round(performance.now())));
})();
