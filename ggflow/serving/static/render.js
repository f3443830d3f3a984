/* Render a reply's text into an element: fenced code blocks (```lang ... ```, an unclosed one too, as while
   streaming) become <pre><code>, `inline code` becomes <code>, the rest stays text. Everything goes in as DOM
   text nodes (textContent), never as HTML, so whatever the model writes is shown, not run. */
(function () {
  "use strict";

  function escapeHtml(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }

  function appendInline(el, text) {
    const parts = text.split(/`([^`\n]+)`/);   // odd indices: inline code
    parts.forEach(function (part, i) {
      if (!part) return;
      if (i % 2) {
        const code = document.createElement("code");
        code.textContent = part;
        el.appendChild(code);
      } else {
        el.appendChild(document.createTextNode(part));
      }
    });
  }

  function renderInto(el, text) {
    el.replaceChildren();
    const fence = /```([^\n`]*)\n?([\s\S]*?)(?:```|$)/g;
    let last = 0;
    let m;
    while ((m = fence.exec(text)) !== null) {
      if (m.index > last) appendInline(el, text.slice(last, m.index));
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      const lang = m[1].trim().replace(/[^\w+#.-]/g, "");
      if (lang) code.className = "language-" + lang;
      code.textContent = m[2];
      pre.appendChild(code);
      el.appendChild(pre);
      last = fence.lastIndex;
      if (last >= text.length) break;
    }
    if (last < text.length) appendInline(el, text.slice(last));
  }

  window.GGFlowRender = { renderInto: renderInto, escapeHtml: escapeHtml };
})();
