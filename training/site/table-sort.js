// Sort any <table class="sortable"> by clicking a header: numbers by data-value (cells without
// one, "not measured", always go last), text by its content. A second click reverses the order.
(function () {
  "use strict";

  function cellKey(row, column, type) {
    var cell = row.cells[column];
    if (type === "num") {
      var raw = cell.getAttribute("data-value");
      return raw === null || raw === "" ? null : parseFloat(raw);
    }
    return cell.textContent.trim().toLowerCase();
  }

  function sortBy(table, header) {
    var column = header.cellIndex;
    var type = header.getAttribute("data-type") || "text";
    // numbers start high-to-low (best first), text A-to-Z
    var ascending = header.getAttribute("aria-sort")
      ? header.getAttribute("aria-sort") !== "ascending"
      : type !== "num";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellKey(a, column, type), y = cellKey(b, column, type);
      if (x === null && y === null) return 0;
      if (x === null) return 1;
      if (y === null) return -1;
      var order = x < y ? -1 : x > y ? 1 : 0;
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) { th.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (header) {
      header.addEventListener("click", function () { sortBy(table, header); });
    });
  });
})();
