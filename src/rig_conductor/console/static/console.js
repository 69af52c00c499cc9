// rig-conductor console: the few behaviours the server-rendered pages need.
// - forms and buttons with data-confirm ask before they submit;
// - "select all" checkboxes; buttons marked data-needs-selection need a selection;
// - the live part of a page (#live, data-refresh="<seconds>") is fetched again on that period
//   through htmx, only while the tab is visible, and not while the operator has rows selected
//   or is typing in it;
// - the plots (uPlot): pending and reclaims per scan, and the last hour's work (completions
//   per 5 minutes, the groups' lag), redrawn when htmx swaps in fresh numbers;
// - data-ready on <body> once the page is drawn and htmx has settled what it fetched: taken off
//   while a live part is being fetched, its value the number of times the page has settled
//   (whoever waits on the page, the browser tests among them, waits for this, not for a time).
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var button = event.submitter;
    var needsSelection = button && button.hasAttribute("data-needs-selection");
    if (needsSelection && !form.querySelector("input[type=checkbox][name]:checked")) {
      event.preventDefault();
      window.alert("Select at least one row first.");
      return;
    }
    var question = (button && button.getAttribute("data-confirm")) || form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (box.classList && box.classList.contains("all")) {
      var table = box.closest("table");
      table.querySelectorAll("tbody input[type=checkbox]").forEach(function (row) {
        row.checked = box.checked;
      });
    }
  });

  var MIN_SPAN_S = 60;

  // The plots: where, the JSON they read (a <script> of that class in the live part), and the
  // series drawn from it. Each is made once and given fresh data when htmx swaps the numbers.
  var PLOTS = [
    {
      id: "plot",
      source: "script.series",
      data: function (d) { return [d.t, d.pending, d.reclaimed, d.deadLettered]; },
      series: [
        { label: "pending", stroke: "#2563eb", width: 2 },
        { label: "reclaimed", stroke: "#16a34a", width: 2 },
        { label: "dead-lettered", stroke: "#dc2626", width: 2 }
      ]
    },
    {
      id: "work-plot",
      source: "script.work-series",
      data: function (d) { return [d.t, d.finished, d.lag]; },
      series: [
        { label: "completed per 5 min", stroke: "#16a34a", width: 2 },
        { label: "lag (unread entries)", stroke: "#9333ea", width: 2, spanGaps: true }
      ]
    }
  ];

  function draw() {
    if (typeof uPlot === "undefined") return;
    PLOTS.forEach(function (spec) {
      var target = document.getElementById(spec.id);
      var node = document.querySelector(spec.source);
      if (!target || !node) return;
      var data = spec.data(JSON.parse(node.textContent));
      if (target.uplot) {
        target.uplot.setData(data);
        return;
      }
      var made = new uPlot({
        width: Math.max(320, target.clientWidth || 800),
        height: 220,
        series: [{}].concat(spec.series),
        scales: {
          // uPlot spreads a lone point (or two close ones) over years: show at least the last
          // minute up to the newest point instead, the points a little in from the edges, and
          // counts from zero.
          x: {
            time: true,
            range: function (u, min, max) {
              var span = Math.max(max - min, MIN_SPAN_S);
              var pad = span / 20;
              return [max - span - pad, max + pad];
            }
          },
          y: {
            range: function (u, min, max) {
              return [0, Math.max(1, Math.ceil((max || 0) * 1.1))];
            }
          }
        },
        axes: [{}, { size: 60 }]
      }, data, target);
      target.uplot = made; // the scales, for whoever inspects the page (the browser tests do)
      window.addEventListener("resize", function () {
        made.setSize({ width: Math.max(320, target.clientWidth), height: 220 });
      });
    });
  }

  var lastRefresh = Date.now();

  function busy(live) {
    if (live.querySelector("input[type=checkbox]:checked")) return true;
    var focused = document.activeElement;
    return !!focused && live.contains(focused) && /^(INPUT|SELECT|TEXTAREA)$/.test(focused.tagName);
  }

  function tick() {
    var live = document.getElementById("live");
    if (!live || typeof htmx === "undefined" || document.visibilityState !== "visible") return;
    var period = Number(live.getAttribute("data-refresh") || "0") * 1000;
    if (!period || Date.now() - lastRefresh < period || busy(live)) return;
    lastRefresh = Date.now();
    htmx.ajax("GET", live.getAttribute("data-src"), { target: "#live", swap: "outerHTML" });
  }

  var settles = 0;

  function settled() {
    settles += 1;
    document.body.setAttribute("data-ready", String(settles));
  }

  function fetching() {
    document.body.removeAttribute("data-ready");
  }

  setInterval(tick, 1000);
  document.addEventListener("visibilitychange", tick);
  document.addEventListener("DOMContentLoaded", function () {
    draw();
    if (typeof htmx !== "undefined") settled(); // else the live parts never refresh: not ready
  });
  document.addEventListener("htmx:afterSwap", draw);
  document.addEventListener("htmx:beforeRequest", fetching);
  document.addEventListener("htmx:afterSettle", settled);
  // A failed fetch swaps nothing in: the page stays as it was, settled.
  document.addEventListener("htmx:afterRequest", function (event) {
    if (!event.detail.successful) settled();
  });
  document.body && document.body.addEventListener("htmx:configRequest", function (event) {
    event.detail.headers["X-CSRF-Token"] = document.body.getAttribute("data-csrf");
  });
})();
