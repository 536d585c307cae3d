// Draws every <figure class="chart" data-src=URL data-key=KEY> with uPlot from the console's
// JSON series ({t: [seconds], series: {name: [values]}}), and redraws it at each sample.
"use strict";

const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

function chartOptions(figure, names, width) {
  return {
    title: figure.dataset.title,
    width: width,
    height: 220,
    series: [{}].concat(names.map((name, i) => ({
      label: name,
      stroke: palette[i % palette.length],
      width: 1.5,
      spanGaps: false,
    }))),
    axes: [{}, { label: figure.dataset.unit || "" }],
    legend: { live: false },
  };
}

async function draw(figure) {
  const response = await fetch(figure.dataset.src, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    figure.dataset.state = "error";
    return;
  }
  const data = (await response.json())[figure.dataset.key];
  const names = Object.keys(data.series);
  if (!names.length) {
    // Nothing to draw (no slave, no consumer yet): say so instead of an empty grid.
    if (figure.plot) figure.plot.destroy();
    figure.plot = null;
    figure.signature = null;
    const caption = document.createElement("figcaption");
    caption.textContent = figure.dataset.title + ": nothing to show yet";
    figure.replaceChildren(caption);
    figure.dataset.state = "empty";
    return;
  }
  const columns = [data.t].concat(names.map((n) => data.series[n]));
  const signature = names.join("\u0000");
  figure.dataset.points = String(data.t.length);
  figure.dataset.last = JSON.stringify(names.map((n) => data.series[n][data.series[n].length - 1] ?? null));
  if (figure.plot && figure.signature === signature) {
    figure.plot.setData(columns);
  } else {
    if (figure.plot) figure.plot.destroy();
    figure.replaceChildren();
    const width = Math.max(figure.clientWidth, 280);
    figure.plot = new uPlot(chartOptions(figure, names, width), columns, figure);
    figure.signature = signature;
  }
  figure.dataset.state = "drawn";
}

function start() {
  const figures = Array.from(document.querySelectorAll("figure.chart"));
  if (!figures.length) return;
  const every = 1000 * Number(document.body.dataset.interval || 10);
  const redraw = () => figures.forEach((f) => draw(f).catch(() => { f.dataset.state = "error"; }));
  redraw();
  setInterval(redraw, every);
}

document.addEventListener("DOMContentLoaded", start);
