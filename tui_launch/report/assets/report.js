/* tuilaunch report: the plots (uPlot) and the marks on them, from the JSON in #report-data. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf"];
  var MARK_COLORS = data.markColors;

  function drawMarks(u) {
    var ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
    ctx.save();
    ctx.lineWidth = Math.max(1, devicePixelRatio);
    data.marks.forEach(function (m) {
      var color = MARK_COLORS[m.kind];
      if (!color) return;
      var x = Math.round(u.valToPos(m.t, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
      ctx.strokeStyle = color;
      ctx.setLineDash(m.kind === "restart" ? [4, 3] : []);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
    });
    ctx.restore();
  }

  function plot(spec) {
    var holder = document.getElementById(spec.id);
    if (!holder) return;
    var series = [{}];
    spec.names.forEach(function (name, i) {
      series.push({label: name, stroke: COLORS[i % COLORS.length], width: 1.5,
        spanGaps: false, value: function (u, v) { return v == null ? "-" : v.toFixed(spec.digits) + spec.unit; }});
    });
    var opts = {
      title: spec.title,
      width: Math.max(320, holder.clientWidth || 900),
      height: 240,
      series: series,
      scales: {x: {time: true}},
      axes: [{}, {label: spec.axis, size: 60}],
      hooks: {draw: [drawMarks]},
      legend: {live: true}
    };
    var u = new uPlot(opts, [spec.t].concat(spec.values), holder);
    holder.setAttribute("data-plotted", String(spec.names.length));
    plots.push([u, holder]);
  }

  var plots = [];
  try {
    data.plots.forEach(plot);
    document.body.setAttribute("data-plots", String(plots.length));
  } catch (err) {
    var box = document.getElementById("plot-error");
    box.textContent = "the plots could not be drawn: " + err;
    box.hidden = false;
  }
  window.addEventListener("resize", function () {
    plots.forEach(function (p) { p[0].setSize({width: Math.max(320, p[1].clientWidth), height: 240}); });
  });
})();
