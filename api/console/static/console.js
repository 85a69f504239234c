// The console's charts: uPlot over the JSON of /console/api/usage-series, refreshed in
// place (no page reload). Each chart's data stays readable at window.lpCharts[name].data.
(function () {
  "use strict";
  var SERIES = {
    rps: [["requests/s", "#0b5394"]],
    tok_s: [["output tok/s", "#1b5e20"]],
    ttft: [["TTFT p50", "#6a1b9a"], ["TTFT p95", "#c62828"]],
    itl_p95: [["ITL p95", "#e65100"]],
    error_pct: [["error rate", "#a50e0e"]],
  };
  var KEYS = { rps: ["rps"], tok_s: ["tok_s"], ttft: ["ttft_p50", "ttft_p95"], itl_p95: ["itl_p95"], error_pct: ["error_pct"] };
  // Each chart's y unit, on its axis and in its legend.
  var UNITS = { rps: "req/s", tok_s: "tok/s", ttft: "ms", itl_p95: "ms", error_pct: "%" };
  window.lpCharts = {};

  function columns(name, s) {
    var out = [s.t];
    KEYS[name].forEach(function (k) { out.push(s[k]); });
    return out;
  }

  // A y scale from 0 to a little over the largest value; a flat zero line still has a range
  // (1, or 100 for a percentage of errors would hide a 0.5% rate: 5 there).
  function yRange(name) {
    return function (u, lo, hi) { return [0, Math.max(hi * 1.1, name === "error_pct" ? 5 : 1)]; };
  }

  // Axis text and grid in the theme's colours (the canvas does not follow CSS).
  function themed(axis) {
    var css = getComputedStyle(document.documentElement);
    axis.stroke = css.getPropertyValue("--fg").trim() || "#1b1f24";
    axis.grid = { stroke: css.getPropertyValue("--line").trim() || "#d5d9e0", width: 1 };
    axis.ticks = { stroke: axis.grid.stroke, width: 1 };
    return axis;
  }

  function yAxis(unit) {
    return themed({ label: unit, values: function (u, ticks) { return ticks.map(function (v) { return v + (unit === "%" ? "%" : ""); }); } });
  }

  function make(el, name, data) {
    var unit = UNITS[name];
    var opts = {
      width: Math.max(360, el.clientWidth || 420), height: 200,
      // spanGaps: a minute without requests has no latency; the line joins its neighbours.
      series: [{}].concat(SERIES[name].map(function (p) {
        return { label: p[0] + " (" + unit + ")", stroke: p[1], width: 2, spanGaps: true, points: { show: false } };
      })),
      scales: { y: { range: yRange(name) } },
      axes: [themed({}), yAxis(unit)],
    };
    return new uPlot(opts, data, el);
  }

  function refresh(root, windowName) {
    fetch(root.dataset.src + "?window=" + encodeURIComponent(windowName), { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (body) {
        window.lpSeries = body;
        root.querySelectorAll("[data-chart]").forEach(function (el) {
          var name = el.dataset.chart, data = columns(name, body.series), chart = window.lpCharts[name];
          if (chart) { chart.setData(data); } else { window.lpCharts[name] = make(el, name, data); }
        });
        root.dataset.updated = String(Date.now());
      })
      .catch(function () { root.dataset.failed = String(Date.now()); });
  }

  var PALETTE = ["#0b5394", "#1b5e20", "#6a1b9a", "#c62828", "#e65100", "#00695c", "#4e342e", "#37474f"];

  function bars(el) {
    var doc = JSON.parse(el.dataset.usage || "{}");
    if (!doc.t || !doc.t.length || !doc.series.length) { return; }
    var data = [doc.t].concat(doc.series.map(function (s) { return s.values; }));
    var series = [{}].concat(doc.series.map(function (s, i) {
      return { label: s.label, stroke: PALETTE[i % PALETTE.length], width: 2, points: { show: false } };
    }));
    var lo = doc.x_range[0], hi = doc.x_range[1];
    window.lpCharts.usage = new uPlot({
      width: Math.max(360, el.clientWidth || 600), height: 200, series: series,
      scales: { x: { time: true, range: function () { return [lo, hi]; } }, y: { range: yRange("usage") } },
      axes: [themed({}), yAxis("requests/day")],
    }, data, el);
  }

  // Sortable tables: each header of a `table.sortable` becomes a button that sorts the rows
  // shown (by a cell's data-sort, else its text; numbers as numbers), with aria-sort.
  function cellKey(row, i) {
    var cell = row.cells[i];
    if (!cell) { return ""; }
    var raw = cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent.trim();
    var n = Number(raw.replace(/[,%]/g, ""));
    return raw !== "" && !isNaN(n) ? n : raw.toLowerCase();
  }

  function sortable(table) {
    var body = table.tBodies[0];
    if (!body || !table.tHead) { return; }
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      if (th.dataset.nosort !== undefined) { return; }
      var button = document.createElement("button");
      button.type = "button";
      button.className = "sort";
      while (th.firstChild) { button.appendChild(th.firstChild); }
      th.appendChild(button);
      button.addEventListener("click", function () {
        var dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
        Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir);
        var rows = Array.prototype.filter.call(body.rows, function (r) { return !r.querySelector("td.empty"); });
        rows.sort(function (a, b) {
          var x = cellKey(a, i), y = cellKey(b, i), c = x < y ? -1 : x > y ? 1 : 0;
          return dir === "ascending" ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }

  // A deployment's load over time as the API sampled it (kept on the server, see
  // api/console/load_history.py): the whole history is fetched again at each refresh.
  var LOAD = [["KV use (%)", "kv_pct", "#0b5394"], ["queued", "waiting", "#c62828"],
              ["running", "running", "#1b5e20"], ["resident adapters", "resident", "#6a1b9a"]];

  function loadHistory(el) {
    var chart = null;
    function refreshLoad() {
      fetch(el.dataset.loadHistory, { credentials: "same-origin" })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
        .then(function (body) {
          var s = body.series, data = [s.t].concat(LOAD.map(function (p) { return s[p[1]]; }));
          if (!chart) {
            chart = new uPlot({
              width: Math.max(360, el.clientWidth || 600), height: 200,
              series: [{}].concat(LOAD.map(function (p) { return { label: p[0], stroke: p[2], width: 2, points: { show: s.t.length < 3, size: 4 } }; })),
              // From the oldest sample to the newest (for one sample uPlot would pad the
              // range it passes by 1000 days each side).
              scales: { x: { time: true, range: function (u) { var ts = u.data[0]; return ts.length ? [Math.min(ts[0], ts[ts.length - 1] - 60), ts[ts.length - 1]] : [0, 1]; } }, y: { range: yRange("load") } },
              axes: [themed({}), yAxis("")],
            }, data, el);
            window.lpCharts.load = chart;
          } else { chart.setData(data); }
          el.dataset.updated = String(Date.now());
          setTimeout(refreshLoad, Math.max(5000, 1000 * (body.every_s || 10)));
        })
        .catch(function () { el.dataset.failed = String(Date.now()); setTimeout(refreshLoad, 10000); });
    }
    refreshLoad();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table.sortable").forEach(sortable);
    document.querySelectorAll("[data-load-history]").forEach(loadHistory);
    var root = document.getElementById("charts");
    document.querySelectorAll("[data-bars]").forEach(bars);
    if (!root) { return; }
    var select = document.getElementById("chart-window");
    var current = select ? select.value : "hour";
    refresh(root, current);
    setInterval(function () { refresh(root, current); }, Number(root.dataset.refreshMs || 5000));
    if (select) { select.addEventListener("change", function () { current = select.value; refresh(root, current); }); }
  });
})();
