/* colltutor's explorer in the browser: pick a collective, an algorithm and a number
   of ranks, and step through the rounds of a real run saved at build time
   (colltutor.explore.export, written to colltutor-explorer-data.js by
   book/_ext/colltutor_explorer.py).  No network, no libraries: plain DOM and SVG.
   Each step k shows every rank's buffers as round k starts (the elements about to
   be sent outlined, the places about to be written dashed) and who sends to whom
   in round k; the last step shows the result. */
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00",
                 "#CC79A7", "#999999"];
  var FONT = 13;            // px, cell and rank labels at natural size
  var EMPTY = -1;

  function tint(hex, white) {
    var n = parseInt(hex.slice(1), 16), out = [];
    [16, 8, 0].forEach(function (s) {
      var c = (n >> s) & 255;
      out.push(Math.round(c + (255 - c) * white));
    });
    return "rgb(" + out.join(",") + ")";
  }

  function decode(v) {  // colltutor.tracing.decode
    if (v === EMPTY || v < 0 || v !== Math.floor(v)) return null;
    var mask = v % 65536, rest = Math.floor(v / 65536), ranks = [];
    for (var r = 0; r < 16; r++) if ((mask >> r) & 1) ranks.push(r);
    if (!ranks.length || rest % ranks.length) return null;
    return {ranks: ranks, index: rest / ranks.length};
  }

  function ranges(ranks) {  // [0,1,2,5] -> "0-2,5"
    var out = [], i = 0;
    while (i < ranks.length) {
      var j = i;
      while (j + 1 < ranks.length && ranks[j + 1] === ranks[j] + 1) j++;
      out.push(i === j ? String(ranks[i]) : ranks[i] + "-" + ranks[j]);
      i = j + 1;
    }
    return out.join(",");
  }

  function label(v, position) {  // colltutor.draw.label
    var d = decode(v);
    if (!d) return v === EMPTY ? "" : String(v);
    var where = d.index === position ? "" : ":" + d.index;
    return (d.ranks.length === 1 ? String(d.ranks[0]) : "\u03a3" + ranges(d.ranks))
      + where;
  }

  function fill(v, size) {
    var d = decode(v);
    if (!d) return "#ffffff";
    if (d.ranks.length === 1) return tint(PALETTE[d.ranks[0] % 8], 0.55);
    if (d.ranks.length === size) return "#222222";
    return "#d9d9d9";
  }

  function el(name, attrs, parent, text) {
    var e = document.createElementNS(SVGNS, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function html(name, attrs, parent, text) {
    var e = document.createElement(name);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function option(select, value, text) {
    var o = html("option", {value: value}, select, text);
    return o;
  }

  var counter = 0;

  function draw(t, k, id) {
    var names = t.buffers, size = t.ranks, done = k >= t.rounds;
    var msgs = t.messages.filter(function (m) { return m[0] === k; });
    var count = names.length ? t.states[names[0]][0][0].length : 0;
    var cells = names.reduce(function (n, name) {
      return n + t.states[name][0][0].length; }, 0);
    var cw = cells > 10 ? 44 : 52, ch = 26, labelW = 62, gap = 18, top = 26;
    var gridW = names.length ? Math.max(labelW + cells * cw + gap * (names.length - 1),
                                        labelW + 200) + 10 : 0;  // room for titles
    var radius = 70 + 9 * size, circleW = 2 * radius + 70, circleH = 2 * radius + 90;
    var below = gridW + circleW > 780;
    var gridH = top + size * (ch + 6);
    var width = below ? Math.max(gridW, circleW) : gridW + circleW;
    var height = below ? gridH + circleH : Math.max(gridH, circleH);
    var svg = el("svg", {"class": "colltutor-svg", role: "img", width: width,
                         height: height, viewBox: "0 0 " + width + " " + height,
                         "font-family": "'DejaVu Sans', sans-serif"});
    var defs = el("defs", {}, svg);
    for (var r = 0; r < size; r++) {
      var marker = el("marker", {id: id + "-a" + r, viewBox: "0 0 10 10", refX: 9,
                                 refY: 5, markerWidth: 7, markerHeight: 7,
                                 orient: "auto-start-reverse"}, defs);
      el("path", {d: "M0,0 L10,5 L0,10 z", fill: PALETTE[r % 8]}, marker);
    }
    // the buffers, one row per rank
    var x0 = labelW;
    names.forEach(function (name, b) {
      var rows = t.states[name][Math.min(k, t.rounds)];
      var n = rows[0].length;
      var one = names.length === 1;
      el("text", {x: one ? x0 : x0 + n * cw / 2, y: 16,
                  "text-anchor": one ? "start" : "middle",
                  "font-size": FONT, "font-weight": "bold"}, svg,
         names.length > 1 ? name : (done ? "result" : "buffers as round " + (k + 1)
                                                       + " starts"));
      for (var r = 0; r < size; r++) {
        var y = top + r * (ch + 6);
        if (b === 0) {
          el("text", {x: 4, y: y + ch / 2 + 5, "font-size": FONT}, svg, "rank " + r);
        }
        for (var i = 0; i < n; i++) {
          var v = rows[r][i], bg = fill(v, size);
          el("rect", {x: x0 + i * cw, y: y, width: cw - 2, height: ch, fill: bg,
                      stroke: "#888888", "stroke-width": 0.8}, svg);
          var text = label(v, i);
          if (text) {
            var fs = text.length * 0.62 * FONT > cw - 4 ? FONT - 2 : FONT;
            el("text", {x: x0 + i * cw + (cw - 2) / 2, y: y + ch / 2 + 4.5,
                        "text-anchor": "middle", "font-size": fs,
                        fill: bg === "#222222" ? "#ffffff" : "#111111"}, svg, text);
          }
        }
      }
      if (!done) {
        msgs.forEach(function (m) {
          [[m[1], m[4], m[5], m[6], "none"], [m[2], m[7], m[8], m[9], "5,3"]]
            .forEach(function (side) {
              if (side[1] !== b || side[3] <= side[2]) return;
              el("rect", {x: x0 + side[2] * cw - 1, y: top + side[0] * (ch + 6) - 2,
                          width: (side[3] - side[2]) * cw, height: ch + 4,
                          fill: "none", stroke: PALETTE[m[1] % 8],
                          "stroke-width": 3, "stroke-dasharray": side[4]}, svg);
            });
        });
      }
      x0 += n * cw + gap;
    });
    // who sends to whom in round k: ranks on a circle, one arrow per message
    var cx = below ? width / 2 : gridW + circleW / 2;
    var cy = (below ? gridH : 0) + 55 + radius;
    var pos = [];
    for (var q = 0; q < size; q++) {
      var a = -Math.PI / 2 + 2 * Math.PI * q / size;
      pos.push([cx + radius * Math.cos(a), cy + radius * Math.sin(a)]);
    }
    el("text", {x: cx, y: cy - radius - 39, "text-anchor": "middle",
                "font-size": FONT, "font-weight": "bold"}, svg,
       done ? "done" : "round " + (k + 1) + ": " + msgs.length + " message"
       + (msgs.length === 1 ? "" : "s"));
    var seen = {};
    msgs.forEach(function (m) {
      var s = pos[m[1]], d = pos[m[2]], key = m[1] + ">" + m[2];
      var j = seen[key] = (seen[key] || 0) + 1;
      var dx = d[0] - s[0], dy = d[1] - s[1], len = Math.hypot(dx, dy) || 1;
      var ux = dx / len, uy = dy / len, bend = 14 * j;
      var sx = s[0] + ux * 18, sy = s[1] + uy * 18;
      var ex = d[0] - ux * 20, ey = d[1] - uy * 20;
      var mx = (sx + ex) / 2 - uy * bend, my = (sy + ey) / 2 + ux * bend;
      el("path", {d: "M" + sx + "," + sy + " Q" + mx + "," + my + " " + ex + ","
                  + ey, fill: "none", stroke: PALETTE[m[1] % 8], "stroke-width": 2.2,
                  "marker-end": "url(#" + id + "-a" + m[1] + ")"}, svg);
    });
    pos.forEach(function (p, q) {
      el("circle", {cx: p[0], cy: p[1], r: 16, fill: tint(PALETTE[q % 8], 0.55),
                    stroke: "#333333"}, svg);
      el("text", {x: p[0], y: p[1] + 5, "text-anchor": "middle", "font-size": FONT},
         svg, String(q));
    });
    return svg;
  }

  function describe(t, k) {  // the messages of round k, in words
    var names = t.buffers;
    return t.messages.filter(function (m) { return m[0] === k; }).map(function (m) {
      var what = m[3] + " element" + (m[3] === 1 ? "" : "s");
      if (m[4] >= 0 && m[6] > m[5]) {
        var row = t.states[names[m[4]]][k][m[1]].slice(m[5], m[6]);
        what = names[m[4]] + "[" + m[5] + ":" + m[6] + "] = "
          + row.map(function (v, i) { return label(v, -1) || "empty"; }).join(" ");
      }
      return "rank " + m[1] + " \u2192 rank " + m[2] + ": " + what;
    });
  }

  function build(root, data) {
    var id = "ctx" + (counter++);
    var state = {collective: root.dataset.collective || "all_reduce",
                 algorithm: root.dataset.algorithm || "",
                 ranks: parseInt(root.dataset.ranks || "4", 10),
                 k: parseInt(root.dataset.round || "0", 10)};
    root.textContent = "";
    var controls = html("div", {"class": "colltutor-explorer-controls"}, root);
    function labelled(text, control) {
      var l = html("label", {}, controls, text + " ");
      l.appendChild(control);
      return control;
    }
    var pick = labelled("collective", html("select", {name: "collective"}));
    Object.keys(data.collectives).forEach(function (c) { option(pick, c, c); });
    var algo = labelled("algorithm", html("select", {name: "algorithm"}));
    var ranks = labelled("ranks", html("select", {name: "ranks"}));
    var steps = html("div", {"class": "colltutor-explorer-steps"}, root);
    var first = html("button", {type: "button", name: "first",
                                title: "Back to the start"}, steps, "|\u25c0 start");
    var back = html("button", {type: "button", name: "back",
                               title: "Previous round"}, steps, "\u25c0 back");
    var slider = html("input", {type: "range", name: "round", min: 0, step: 1,
                                "aria-label": "round"}, steps);
    var next = html("button", {type: "button", name: "next",
                               title: "Next round"}, steps, "next \u25b6");
    var last = html("button", {type: "button", name: "last",
                               title: "Jump to the result"}, steps, "end \u25b6|");
    var figure = html("figure", {"class": "colltutor-explorer-figure"}, root);
    var picture = html("div", {"class": "colltutor-explorer-picture"}, figure);
    var caption = html("figcaption", {"aria-live": "polite"}, figure);
    var list = html("ul", {"class": "colltutor-explorer-messages"}, root);

    function current() {
      return data.traces[state.collective + "/" + state.algorithm + "/" + state.ranks];
    }
    function fillChoices() {
      var algorithms = data.collectives[state.collective];
      if (algorithms.indexOf(state.algorithm) < 0) state.algorithm = algorithms[0];
      algo.textContent = "";
      algorithms.forEach(function (a) { option(algo, a, a.replace(/_/g, " ")); });
      ranks.textContent = "";
      data.sizes.forEach(function (p) {
        if (data.traces[state.collective + "/" + state.algorithm + "/" + p]) {
          option(ranks, p, String(p));
        }
      });
      pick.value = state.collective;
      algo.value = state.algorithm;
      if (!current()) state.ranks = parseInt(ranks.options[0].value, 10);
      ranks.value = String(state.ranks);
    }
    function show() {
      var t = current();
      state.k = Math.max(0, Math.min(state.k, t.rounds));
      slider.max = t.rounds;
      slider.value = state.k;
      picture.textContent = "";
      picture.appendChild(draw(t, state.k, id));
      var name = state.collective + " (" + state.algorithm.replace(/_/g, " ") + "), "
        + t.ranks + " ranks" + (t.buffers.length ? ", " + t.count + " element"
        + (t.count === 1 ? "" : "s") + " per buffer" : "") + ": ";
      caption.textContent = name + (state.k >= t.rounds
        ? "the result, after " + t.rounds + " round" + (t.rounds === 1 ? "" : "s")
          + " and " + t.messages.length + " messages."
        : "round " + (state.k + 1) + " of " + t.rounds + ".");
      picture.firstChild.setAttribute("aria-label", caption.textContent);
      list.textContent = "";
      describe(t, state.k).forEach(function (line) { html("li", {}, list, line); });
      back.disabled = first.disabled = state.k === 0;
      next.disabled = last.disabled = state.k >= t.rounds;
      root.dataset.shown = state.collective + "/" + state.algorithm + "/"
        + state.ranks + "/" + state.k;
    }
    pick.addEventListener("change", function () {
      state.collective = pick.value; state.k = 0; fillChoices(); show(); });
    algo.addEventListener("change", function () {
      state.algorithm = algo.value; state.k = 0; fillChoices(); show(); });
    ranks.addEventListener("change", function () {
      state.ranks = parseInt(ranks.value, 10); state.k = 0; show(); });
    slider.addEventListener("input", function () {
      state.k = parseInt(slider.value, 10); show(); });
    first.addEventListener("click", function () { state.k = 0; show(); });
    back.addEventListener("click", function () { state.k -= 1; show(); });
    next.addEventListener("click", function () { state.k += 1; show(); });
    last.addEventListener("click", function () { state.k = 1e9; show(); });
    if (!data.collectives[state.collective]) {
      state.collective = Object.keys(data.collectives)[0];
    }
    fillChoices();
    show();
    root.classList.add("colltutor-explorer-ready");
  }

  function start() {
    var data = window.COLLTUTOR_EXPLORER_DATA;
    document.querySelectorAll("div.colltutor-explorer").forEach(function (root) {
      if (!data) {
        root.textContent = "The explorer's data did not load.";
        return;
      }
      build(root, data);
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
