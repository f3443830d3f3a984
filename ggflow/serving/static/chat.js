/* The chat page: a conversation streamed from /v1/chat/completions (server-sent events read from fetch's body),
   stopped with an AbortController (the server cancels the request when the connection closes). Settings
   (system prompt, temperature, max tokens, API key) are kept in localStorage. No build step, no libraries. */
(function () {
  "use strict";
  const $ = function (id) { return document.getElementById(id); };
  const SETTINGS = ["system", "temperature", "max-tokens", "api-key"];
  const conversation = [];   // {role, content} of the turns so far (the system prompt is added per request)
  let controller = null;

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = $("api-key").value.trim();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  function showError(message) {
    $("error").textContent = message;
    $("error").hidden = !message;
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
    $("status").textContent = busy ? "generating\u2026" : "";
  }

  function addMessage(role, text) {
    const box = document.createElement("div");
    box.className = "message " + role;
    const who = document.createElement("div");
    who.className = "role";
    who.textContent = role;
    const content = document.createElement("div");
    content.className = "content";
    GGFlowRender.renderInto(content, text);
    box.append(who, content);
    $("messages").appendChild(box);
    $("messages").scrollTop = $("messages").scrollHeight;
    return box;
  }

  async function loadModels() {
    try {
      const r = await fetch("/v1/models", { headers: headers() });
      if (!r.ok) throw new Error(await errorMessage(r));
      const data = await r.json();
      const select = $("model");
      select.replaceChildren();
      (data.data || []).forEach(function (m) {
        const option = document.createElement("option");
        option.value = option.textContent = m.id;
        select.appendChild(option);
      });
    } catch (e) {
      showError("Could not list the models: " + e.message);
    }
  }

  async function errorMessage(r) {
    try {
      const body = await r.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) { /* not JSON */ }
    return r.status + " " + r.statusText;
  }

  function requestBody() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    const body = { messages: messages.concat(conversation), stream: true };
    const temperature = parseFloat($("temperature").value);
    if (!Number.isNaN(temperature)) body.temperature = temperature;
    const maxTokens = parseInt($("max-tokens").value, 10);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    if ($("model").value) body.model = $("model").value;
    return body;
  }

  async function readStream(response, onText) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const next = await reader.read();
      if (next.done) return;
      buffer += decoder.decode(next.value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end).trim();
        buffer = buffer.slice(end + 1);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
        const choice = chunk.choices && chunk.choices[0];
        if (choice && choice.delta && choice.delta.content) onText(choice.delta.content);
      }
    }
  }

  async function send(text) {
    showError("");
    conversation.push({ role: "user", content: text });
    addMessage("user", text);
    const box = addMessage("assistant", "");
    box.dataset.state = "streaming";
    const content = box.querySelector(".content");
    let reply = "";
    controller = new AbortController();
    setBusy(true);
    try {
      const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
        body: JSON.stringify(requestBody()), signal: controller.signal });
      if (!r.ok) throw new Error(await errorMessage(r));
      await readStream(r, function (piece) {
        reply += piece;
        GGFlowRender.renderInto(content, reply);
        $("messages").scrollTop = $("messages").scrollHeight;
      });
      box.dataset.state = "done";
      conversation.push({ role: "assistant", content: reply });
    } catch (e) {
      if (e.name === "AbortError") {
        box.dataset.state = "stopped";
        box.classList.add("stopped");
        conversation.push({ role: "assistant", content: reply });
      } else {
        box.dataset.state = "error";
        box.remove();
        conversation.pop();   // the turn failed: the user may send it again
        showError(e.message);
      }
    } finally {
      controller = null;
      setBusy(false);
    }
  }

  function restoreSettings() {
    SETTINGS.forEach(function (id) {
      const saved = localStorage.getItem("ggflow." + id);
      if (saved !== null) $(id).value = saved;
      $(id).addEventListener("change", function () { localStorage.setItem("ggflow." + id, $(id).value); });
    });
  }

  $("composer").addEventListener("submit", function (event) {
    event.preventDefault();
    const text = $("input").value.trim();
    if (!text || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", function () { if (controller) controller.abort(); });
  $("clear").addEventListener("click", function () {
    if (controller) controller.abort();
    conversation.length = 0;
    $("messages").replaceChildren();
    showError("");
  });
  $("api-key").addEventListener("change", loadModels);

  restoreSettings();
  loadModels();
})();
