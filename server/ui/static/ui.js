// Laggard status page: live refresh of <main> every data-refresh seconds (server-rendered HTML,
// fetched from this same page), paused while the tab is hidden. Nothing else; no library.
(function () {
  "use strict";
  var period = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  var stamp = document.getElementById("updated");
  if (!(period > 0) || !window.fetch || !window.DOMParser) { return; }
  var busy = false;

  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function now() { var d = new Date(); return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()); }

  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" }, cache: "no-store" })
      .then(function (r) {
        if (r.redirected || r.status === 401 || r.status === 403) { window.location.reload(); return null; }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (text) {
        if (text === null) { return; }
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (!fresh || !main) { return; }
        main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes).map(function (n) { return document.importNode(n, true); }));
        if (stamp) {
          stamp.textContent = "updated " + now() + " UTC";
          stamp.classList.remove("offline");
          stamp.setAttribute("data-updated", String(parseInt(stamp.getAttribute("data-updated") || "0", 10) + 1));
        }
      })
      .catch(function () {
        if (stamp) { stamp.textContent = "collector unreachable, retrying (" + now() + " UTC)"; stamp.classList.add("offline"); }
      })
      .then(function () { busy = false; });
  }

  window.setInterval(refresh, period * 1000);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } });
}());
