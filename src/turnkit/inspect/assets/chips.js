/* Token chips: details on hover and on keyboard focus, arrow keys to move between tokens, and (for pages that
   build chips at run time) chip construction from the pieces the server sends. Everything shown is set with
   textContent: token text is untrusted. */
(function () {
  "use strict";
  var standIns = JSON.parse(document.body.getAttribute("data-stand-ins") || "{}");

  function tokenText(chip) {
    var out = "";
    chip.childNodes.forEach(function (node) {
      if (node.nodeType !== 1) { out += node.textContent; return; }
      if (node.tagName === "I") return;  /* part of a character: its bytes are in data-bytes */
      var shown = node.textContent;
      if (Object.prototype.hasOwnProperty.call(standIns, shown)) out += standIns[shown];
      else if (/^\\u[0-9a-f]{4}$/.test(shown)) out += String.fromCharCode(parseInt(shown.slice(2), 16));
      else out += shown;  /* \xNN: a byte that is not a whole character, shown as it is */
    });
    return out;
  }

  function describe(chip) {
    var id = chip.getAttribute("data-token-id");
    var trained = chip.getAttribute("data-trained") === "1";
    var label = chip.getAttribute("data-label") || (trained ? id : "-100");
    var message = chip.getAttribute("data-message");
    var holder = chip.closest("[data-role]");
    var role = chip.getAttribute("data-role") || (holder ? holder.getAttribute("data-role") : "");
    var where = message === "-1" ? "no message" : "message " + message + (role ? " (" + role + ")" : "");
    var bytes = chip.getAttribute("data-bytes");
    var parts = [
      "id " + id,
      bytes ? "bytes " + bytes + " (part of " + JSON.stringify(chip.getAttribute("data-chars") || "") + ")"
        : "text " + JSON.stringify(tokenText(chip)),
      where,
      "label " + label + (trained ? " (trained)" : " (not trained)"),
      "origin " + chip.getAttribute("data-origin"),
    ];
    if (chip.getAttribute("data-logprob")) parts.push("logprob " + chip.getAttribute("data-logprob"));
    if (chip.getAttribute("data-forged") === "1") parts.push("marker text from data, kept as text");
    return parts.join(" · ");
  }

  var current = null;
  function show(chip) {
    var panel = document.getElementById("details");
    if (!panel || !chip) return;
    if (current) current.classList.remove("current");
    current = chip;
    chip.classList.add("current");
    panel.textContent = describe(chip);
  }

  function chipOf(target) {
    return target && target.closest ? target.closest(".toks > [data-token-id]") : null;
  }

  document.addEventListener("mouseover", function (event) { var c = chipOf(event.target); if (c) show(c); });
  document.addEventListener("focusin", function (event) { var c = chipOf(event.target); if (c) show(c); });
  document.addEventListener("keydown", function (event) {
    var chip = chipOf(event.target);
    if (!chip) return;
    var all = Array.prototype.slice.call(document.querySelectorAll(".toks > [data-token-id]"));
    var at = all.indexOf(chip), next = -1;
    if (event.key === "ArrowRight" || event.key === "ArrowDown") next = Math.min(all.length - 1, at + 1);
    else if (event.key === "ArrowLeft" || event.key === "ArrowUp") next = Math.max(0, at - 1);
    else if (event.key === "Home") next = 0;
    else if (event.key === "End") next = all.length - 1;
    if (next < 0) return;
    event.preventDefault();
    if (!all[next].hasAttribute("tabindex")) all[next].setAttribute("tabindex", "-1");
    all[next].focus();
  });

  /* A chip from a piece {id, segments: [[kind, text]...], control, bytes, chars} and its attributes (playground):
     kind "" is text, "v" a stand-in, "char" a character whose bytes run on into the next tokens, "cont" a token
     that continues one (the character shows once, where it starts). */
  function makeChip(piece, attrs) {
    var chip = document.createElement("span");
    chip.setAttribute("data-token-id", String(piece.id));
    Object.keys(attrs).forEach(function (name) { chip.setAttribute(name, String(attrs[name])); });
    if (piece.bytes) { chip.setAttribute("data-bytes", piece.bytes); chip.setAttribute("data-chars", piece.chars); }
    piece.segments.forEach(function (segment) {
      var kind = segment[0], node;
      if (!kind) { chip.appendChild(document.createTextNode(segment[1])); return; }
      node = document.createElement(kind === "v" ? "b" : "i");
      if (kind !== "v") node.className = kind;
      node.textContent = kind === "cont" ? "\u2040" : segment[1];
      chip.appendChild(node);
    });
    return chip;
  }

  /* Fill a .toks element with chips; the first takes the tab stop, a newline token ends a line. */
  function fill(container, pieces, attrsOf) {
    container.textContent = "";
    pieces.forEach(function (piece, n) {
      var chip = makeChip(piece, attrsOf(piece, n));
      if (n === 0) chip.setAttribute("tabindex", "0");
      container.appendChild(chip);
      if (piece.newline) container.appendChild(document.createElement("br"));
    });
  }

  window.turnkitChips = { describe: describe, tokenText: tokenText, fill: fill };
})();
