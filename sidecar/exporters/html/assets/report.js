/* dflash-sidecar report --html: draws the run's time charts with uPlot from the JSON block
   "dflash-data" (sidecar/exporters/html/render.py writes both). Nothing is fetched. When done,
   window.dflashReport = {drawn: charts drawn, band: verdict -> seconds the band shows, done: true,
   xRanges(): each chart's time range now}
   and performance holds the mark "dflash-drawn". */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("dflash-data").textContent);
  var result = {drawn: 0, band: {}, done: false,
                xRanges: function () { return charts.map(function (u) { return [u.scales.x.min, u.scales.x.max]; }); }};
  window.dflashReport = result;
  var charts = [];
  var syncing = false;
  var PALETTE = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#8c510a"];
  var FEW = (data.x || []).length < 40;
  var AXIS = 56;

  function width(el) {
    return Math.max(320, Math.min(1200, (el.clientWidth || 900) - 8));
  }

  function xRange(u, min, max) {
    if (min === max || min == null) {
      var pad = Math.max(1, (data.band && data.band.length ? data.band[0][1] - data.band[0][0] : 10));
      return [(min || 0) - pad, (max || 0) + pad / 4];
    }
    return [min, max];
  }

  function clip(u) {
    u.ctx.save();
    u.ctx.beginPath();
    u.ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    u.ctx.clip();
  }

  function drawMarkers(u) {
    var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height, r = window.devicePixelRatio || 1;
    clip(u);
    (data.events || []).forEach(function (e) {
      if (e.t < u.scales.x.min || e.t > u.scales.x.max) return;
      var x = Math.round(u.valToPos(e.t, "x", true));
      ctx.save();
      ctx.strokeStyle = e.colour;
      ctx.fillStyle = e.colour;
      ctx.lineWidth = 1.5 * r;
      ctx.setLineDash([4 * r, 3 * r]);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + h);
      ctx.stroke();
      ctx.font = (11 * r) + "px sans-serif";
      ctx.fillText(e.tag, x + 2 * r, top + 11 * r);
      ctx.restore();
    });
    ctx.fillStyle = "#d73027";  /* drops: a red tick at the plot's foot */
    (data.drops || []).forEach(function (d) {
      var x = u.valToPos(d[0], "x", true);
      ctx.fillRect(x - r, top + h - 8 * r, 2 * r, 8 * r);
    });
    ctx.restore();
  }

  function syncX(u, key) {
    if (key !== "x" || syncing) return;
    syncing = true;
    var min = u.scales.x.min, max = u.scales.x.max;
    charts.forEach(function (o) { if (o !== u) o.setScale("x", {min: min, max: max}); });
    syncing = false;
  }

  function make(id, height, series, axes, scales, hooks, bands, values) {
    var figure = document.getElementById(id), holder = figure && figure.querySelector(".chart");
    if (!holder) return null;
    scales.x = {time: true, range: xRange};
    /* every chart's plot spans the same x pixels: a left axis of AXIS px, a right one or as much padding */
    var right = axes.some(function (a) { return a.side === 1; });
    axes.forEach(function (a) { a.size = AXIS; });
    var opts = {
      width: width(holder), height: height, series: [{}].concat(series), axes: [{}].concat(axes),
      padding: [12, right ? 8 : AXIS + 8, 0, 0],
      scales: scales, bands: bands || [], cursor: {sync: {key: "dflash"}, drag: {x: true, y: false}},
      hooks: {drawClear: hooks.drawClear || [], draw: [drawMarkers].concat(hooks.draw || []), setScale: [syncX]}
    };
    var u = new uPlot(opts, [data.x].concat(values), holder);
    charts.push(u);
    result.drawn += 1;
    return u;
  }

  function line(label, colour, scale, fmt, extra) {
    var s = {label: label, stroke: colour, scale: scale, width: 1.5, spanGaps: false,
             points: {show: FEW}, value: function (u, v) { return v == null ? "-" : fmt(v); }};
    for (var k in (extra || {})) s[k] = extra[k];
    return s;
  }

  function scaled(key, factor) {
    return (data.series[key] || []).map(function (v) { return v == null ? null : v * factor; });
  }

  function verdictAt(t) {
    var band = data.band;
    for (var i = 0; i < band.length; i++) {
      if (t >= band[i][0] - 1e-6 && t <= band[i][1] + 1e-6) {
        var v = band[i][3], best = null;
        for (var k in v) if (best === null || v[k] > v[best]) best = k;
        return best || "none";
      }
    }
    return "-";
  }

  function drawBand(u) {
    var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    var perPx = (u.scales.x.max - u.scales.x.min) / u.bbox.width;
    var shown = {};
    clip(u);
    data.band.forEach(function (p) {
      var t0 = p[0], t1 = p[1], v = p[3], span = Math.max(t1 - t0, 1e-9);
      var x0 = u.valToPos(t0, "x", true), x1 = u.valToPos(t1, "x", true), told = 0;
      for (var k in v) told += v[k];
      var x = x1 - (x1 - x0) * told / span;  /* the run's part of a window is its end */
      Object.keys(v).sort().forEach(function (k) {
        var w = (x1 - x0) * v[k] / span;
        ctx.fillStyle = data.colours[k] || "#888888";
        ctx.fillRect(x, top, w + 0.75, h);  /* a hair wider: no seams between neighbours */
        shown[k] = (shown[k] || 0) + w * perPx;
        x += w;
      });
    });
    ctx.restore();
    if (!result.done) result.band = shown;
  }

  function band() {
    var conf = data.series.conf || data.x.map(function () { return null; });
    var ones = data.x.map(function () { return 1; });
    make("band", 110, [
      {label: "verdict", scale: "c", stroke: "transparent", width: 0, points: {show: false},
       value: function (u, v, si, i) { return i == null ? "-" : verdictAt(u.data[0][i]); }},
      line("confidence", "#222222", "c", function (v) { return v.toFixed(2); })
    ], [{scale: "c", size: 40, values: function (u, ticks) { return ticks.map(function (t) { return t.toFixed(1); }); }}],
    {c: {range: [0, 1.05]}}, {drawClear: [drawBand]}, [], [ones, conf]);
  }

  function gpu() {
    var series = [], values = [];
    data.gpus.forEach(function (g, i) {
      series.push(line(g + " busy", PALETTE[i % PALETTE.length], "%", function (v) { return v.toFixed(0) + " %"; }));
      values.push(scaled("busy|" + g, 100));
    });
    data.power.forEach(function (g, i) {
      series.push(line(g + " power", PALETTE[i % PALETTE.length], "W", function (v) { return v.toFixed(0) + " W"; },
                       {dash: [6, 3]}));
      values.push(scaled("power|" + g, 1));
    });
    make("gpu", 220, series, [{scale: "%", size: 50}, {scale: "W", side: 1, size: 60, grid: {show: false}}],
         {"%": {range: [0, 105]}, W: {range: function (u, min, max) { return [0, Math.max(10, max * 1.1)]; }}},
         {}, [], values);
  }

  function steps(role) {
    var classes = Object.keys(data.phases).filter(function (c) { return data.series["step|" + role + "|" + c]; });
    var running = data.x.map(function () { return 0; });
    var series = [], values = [], bands = [];
    classes.forEach(function (c, i) {
      var raw = scaled("step|" + role + "|" + c, 1000);
      var gap = data.x.map(function (x, j) { return classes.every(function (k) {
        return (data.series["step|" + role + "|" + k] || [])[j] == null; }); });
      running = running.map(function (v, j) { return gap[j] ? v : v + (raw[j] || 0); });
      values.push(running.map(function (v, j) { return gap[j] ? null : v; }));
      series.push(line(c, data.phases[c], "ms", function () { return ""; }, {
        fill: data.phases[c] + "cc",
        value: function (u, v, si, j) { return j == null || raw[j] == null ? "-" : raw[j].toFixed(1) + " ms"; }}));
      if (i > 0) bands.push({series: [i + 1, i], fill: data.phases[c] + "cc"});
    });
    if (bands.length) series.forEach(function (s, i) { if (i > 0) s.fill = undefined; });
    make("step-" + role, 200, series, [{scale: "ms", size: 60}], {ms: {range: function (u, min, max) {
      return [0, Math.max(1, max * 1.1)]; }}}, {}, bands, values);
  }

  function rate() {
    var series = [], values = [];
    data.roles.forEach(function (r, i) {
      if (!data.series["rate|" + r]) return;
      series.push(line(r + " steps/s", PALETTE[i % PALETTE.length], "r", function (v) { return v.toFixed(1); }));
      values.push(scaled("rate|" + r, 1));
    });
    var axes = [{scale: "r", size: 50}];
    var scales = {r: {range: function (u, min, max) { return [0, Math.max(1, max * 1.1)]; }}};
    if (data.series.queue) {
      series.push(line("queue fill", "#777777", "%", function (v) { return v.toFixed(0) + " %"; }, {dash: [4, 4]}));
      values.push(scaled("queue", 100));
      axes.push({scale: "%", side: 1, size: 50, grid: {show: false}});
      scales["%"] = {range: [0, 105]};
    }
    make("rate", 180, series, axes, scales, {}, [], values);
  }

  (data.charts || []).forEach(function (c) {
    if (c === "band") band();
    else if (c === "gpu") gpu();
    else if (c === "rate") rate();
    else if (c.indexOf("step|") === 0) steps(c.slice(5));
  });
  window.addEventListener("resize", function () {
    charts.forEach(function (u) { u.setSize({width: width(u.root.parentNode), height: u.height}); });
  });
  requestAnimationFrame(function () {
    result.done = true;
    performance.mark("dflash-drawn");
  });
})();
