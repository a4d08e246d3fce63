// gpuslice: progressive enhancements. Pages work without this file.
(function () {
  "use strict";

  // Sortable tables: click a header with data-sort ("text" or "num").
  function cellValue(row, index, kind) {
    var cell = row.children[index];
    var raw = cell ? (cell.getAttribute("data-value") || cell.textContent.trim()) : "";
    if (kind === "num") {
      var n = parseFloat(raw.replace(/[^0-9.\-]/g, ""));
      return isNaN(n) ? -Infinity : n;
    }
    return raw.toLowerCase();
  }

  function sortBy(th) {
    var table = th.closest("table");
    var body = table.tBodies[0];
    if (!body) return;
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    var kind = th.getAttribute("data-sort");
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, index, kind), y = cellValue(b, index, kind);
      if (x < y) return ascending ? -1 : 1;
      if (x > y) return ascending ? 1 : -1;
      return 0;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }

  document.addEventListener("click", function (e) {
    var th = e.target.closest && e.target.closest("th[data-sort]");
    if (th) sortBy(th);
  });

  document.addEventListener("keydown", function (e) {
    var th = e.target.closest && e.target.closest("th[data-sort]");
    if (th && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); sortBy(th); }
  });

  // Buttons that need a second thought: data-confirm="question".
  document.addEventListener("submit", function (e) {
    var q = e.target.getAttribute && e.target.getAttribute("data-confirm");
    if (q && !window.confirm(q)) e.preventDefault();
  });

  // Times: show <time datetime> in the browser's zone, and tell forms the
  // browser's UTC offset so that a typed start means local time.
  function localise(root) {
    Array.prototype.forEach.call(root.querySelectorAll("time[datetime]"), function (t) {
      var d = new Date(t.getAttribute("datetime"));
      if (!isNaN(d)) {
        t.title = t.textContent;
        t.textContent = d.toLocaleString([], { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
      }
    });
    Array.prototype.forEach.call(root.querySelectorAll("input[data-tz-offset]"), function (i) {
      i.value = String(new Date().getTimezoneOffset());
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localise(document); });

  // The availability timeline: a free stretch (data-fill-start, RFC 3339)
  // puts its start into the booking form's start field in local time
  // (rounded up to the minute, so it stays inside the stretch), or "now".
  function two(n) { return (n < 10 ? "0" : "") + n; }
  function fillStart(el) {
    var input = document.getElementById("start");
    var d = new Date(el.getAttribute("data-fill-start"));
    if (!input || isNaN(d)) return;
    if (d.getTime() <= Date.now() + 60000) {
      input.value = "now";
    } else {
      d = new Date(Math.ceil(d.getTime() / 60000) * 60000);
      input.value = d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + "T" + two(d.getHours()) + ":" + two(d.getMinutes());
    }
    input.focus();
  }
  document.addEventListener("click", function (e) {
    var el = e.target.closest && e.target.closest("[data-fill-start]");
    if (el) { e.preventDefault(); fillStart(el); }
  });
  document.addEventListener("keydown", function (e) {
    var el = e.target.closest && e.target.closest("[data-fill-start]");
    if (el && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); fillStart(el); }
  });
  document.addEventListener("htmx:afterSwap", function (e) { localise(e.target.parentNode || document); });
})();
