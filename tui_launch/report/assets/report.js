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

  // The time axis. uPlot's own labels have two rows (the time, and the date under the first
  // tick of a day) and ticks as close as 50 px, so longer labels ran into each other. Here:
  // one row, formatted by the ticks' spacing, ticks at least one label wide apart (measured in
  // the axis's font), and the dates the plot spans in the axis's title.
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function day(d) { return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()); }
  function hm(d) { return pad(d.getHours()) + ":" + pad(d.getMinutes()); }
  function tick(v, incr, multiDay) {
    var d = new Date(v * 1000);
    if (incr >= 86400) return pad(d.getMonth() + 1) + "-" + pad(d.getDate());
    if (incr < 60) return hm(d) + ":" + pad(d.getSeconds());
    return multiDay ? pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + hm(d) : hm(d);
  }
  var measure = document.createElement("canvas").getContext("2d");
  function timeSpace(u, axisIdx, min, max) {
    // The widest label this span can get, and a gap of 40 % of it.
    measure.font = u.axes[axisIdx].font[0];
    var widest = max - min > 86400 ? "00-00 00:00" : "00:00:00";
    return Math.ceil(measure.measureText(widest).width * 1.4);
  }
  function timeValues(u, splits, axisIdx, space, incr) {
    var scale = u.scales.x;
    var multiDay = scale.max - scale.min > 86400;
    return splits.map(function (v) { return tick(v, incr, multiDay); });
  }
  function timeTitle(t) {
    if (!t.length) return "time";
    var a = new Date(t[0] * 1000), b = new Date(t[t.length - 1] * 1000);
    var off = -a.getTimezoneOffset();
    var zone = "UTC" + (off < 0 ? "-" : "+") + pad(Math.floor(Math.abs(off) / 60)) + ":" + pad(Math.abs(off) % 60);
    var span = day(a) === day(b) ? day(a) : day(a) + " to " + day(b);
    return span + " (" + zone + ", this browser's time zone)";
  }
  function fullTime(u, v) {
    if (v == null) return "--";
    var d = new Date(v * 1000);
    return day(d) + " " + hm(d) + ":" + pad(d.getSeconds());
  }

  function plot(spec) {
    var holder = document.getElementById(spec.id);
    if (!holder) return;
    var series = [{value: fullTime}];
    spec.names.forEach(function (name, i) {
      series.push({label: name, stroke: COLORS[i % COLORS.length], width: 1.5,
        spanGaps: false, value: function (u, v) { return v == null ? "-" : v.toFixed(spec.digits) + spec.unit; }});
    });
    var opts = {
      title: spec.title,
      width: Math.max(320, holder.clientWidth || 900),
      height: 240,
      // Room on the right for half of the last time label, which is centred on its tick.
      padding: [null, 36, null, null],
      series: series,
      scales: {x: {time: true}},
      axes: [
        {label: timeTitle(spec.t), labelSize: 24, space: timeSpace, values: timeValues},
        {label: spec.axis, size: 60}
      ],
      hooks: {draw: [drawMarks]},
      legend: {live: true}
    };
    var u = new uPlot(opts, [spec.t].concat(spec.values), holder);
    holder.setAttribute("data-plotted", String(spec.names.length));
    plots.push([u, holder]);
    window.tuilaunchReport.plots.push(u);
  }

  var plots = [];
  // The drawn plots, for a reader's console and the tests (which measure the axis labels).
  window.tuilaunchReport = {plots: []};
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
