/* The playground: a chat over the server's OpenAI API, streamed, with a stop button, and a token view that shows
   the ids of the last prompt (from POST /tokenize) and of the reply (from the stream's logprobs) as token chips.
   Text from the model or the user is only ever set with textContent. */
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var form = $("chat"), log = $("log"), input = $("input"), status = $("status");
  var send = $("send"), stop = $("stop"), show = $("show-tokens"), view = $("token-view");
  var history = [], last = null, controller = null;

  function headers() {
    var out = { "Content-Type": "application/json" };
    if ($("key").value) out.Authorization = "Bearer " + $("key").value;
    return out;
  }

  function say(text, isError) {
    status.textContent = text;
    status.classList.toggle("error", Boolean(isError));
  }

  async function failure(response) {
    var text = response.status + " " + response.statusText;
    try { var body = await response.json(); if (body.error && body.error.message) text = body.error.message; }
    catch (ignored) { /* not JSON: keep the status line */ }
    return new Error(text);
  }

  async function api(path, body) {
    var response = await fetch(path, body === undefined ? { headers: headers() }
      : { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!response.ok) throw await failure(response);
    return response.json();
  }

  async function loadModels() {
    var select = $("model");
    try {
      var models = await api("/v1/models");
      select.textContent = "";
      models.data.forEach(function (model) {
        var option = document.createElement("option");
        option.value = model.id;
        option.textContent = model.id + (model.max_model_len ? " (" + model.max_model_len + " tokens)" : "");
        select.appendChild(option);
      });
      say("");
    } catch (err) { say("Cannot list models: " + err.message, true); }
  }

  function bubble(role, text) {
    var article = document.createElement("article");
    article.className = "msg";
    article.setAttribute("data-role", role);
    var head = document.createElement("h3");
    head.textContent = role;
    var body = document.createElement("p");
    body.className = "text";
    body.textContent = text;
    article.appendChild(head);
    article.appendChild(body);
    log.appendChild(article);
    return article;
  }

  function conversation() {
    var system = $("system").value.trim();
    return (system ? [{ role: "system", content: system }] : []).concat(history);
  }

  function number(id, parse) {
    var value = $(id).value;
    return value === "" ? undefined : parse(value);
  }

  function setBusy(busy) {
    send.disabled = busy;
    stop.disabled = !busy;
  }

  async function readStream(response, onChunk) {
    var reader = response.body.getReader(), decoder = new TextDecoder(), buffer = "";
    for (;;) {
      var step = await reader.read();
      if (step.done) return;
      buffer += decoder.decode(step.value, { stream: true });
      var events = buffer.split("\n\n");
      buffer = events.pop();
      for (var i = 0; i < events.length; i++) {
        var line = events[i].split("\n").filter(function (l) { return l.indexOf("data: ") === 0; })[0];
        if (!line) continue;
        var data = line.slice(6);
        if (data === "[DONE]") return;
        onChunk(JSON.parse(data));
      }
    }
  }

  async function chat(event) {
    event.preventDefault();
    var text = input.value;
    if (!text.trim() || controller) return;
    history.push({ role: "user", content: text });
    bubble("user", text);
    input.value = "";
    var messages = conversation();
    var reply = bubble("assistant", "");
    var replyText = reply.querySelector(".text");
    reply.setAttribute("aria-busy", "true");
    var model = $("model").value;
    var run = { messages: messages, promptIds: null, reply: [], finish: null, text: "" };
    last = run;
    controller = new AbortController();
    setBusy(true);
    say("Generating…");
    var body = {
      model: model, messages: messages, stream: true, logprobs: true,
      temperature: number("temperature", parseFloat), top_p: number("top_p", parseFloat),
      max_tokens: number("max_tokens", function (v) { return parseInt(v, 10); }),
      seed: number("seed", function (v) { return parseInt(v, 10); }),
    };
    try {
      run.promptIds = (await api("/tokenize", { model: model, messages: messages })).tokens;
      var response = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
      });
      if (!response.ok) throw await failure(response);
      await readStream(response, function (chunk) {
        var choice = chunk.choices && chunk.choices[0];
        if (!choice) return;
        if (choice.delta && choice.delta.content) {
          run.text += choice.delta.content;
          replyText.textContent = run.text;
        }
        if (choice.logprobs && choice.logprobs.content) run.reply = run.reply.concat(choice.logprobs.content);
        if (choice.finish_reason) run.finish = choice.finish_reason;
      });
      say("Done: " + run.reply.length + " tokens, finish_reason " + run.finish + ".");
    } catch (err) {
      if (err.name === "AbortError") { run.finish = "stopped"; say("Stopped after " + run.reply.length + " tokens."); }
      else say(err.message, true);
    } finally {
      controller = null;
      reply.removeAttribute("aria-busy");
      var end = document.createElement("p");
      end.className = "end";
      end.textContent = run.finish === "stopped" ? "(stopped)" : run.finish ? "finish_reason: " + run.finish : "";
      reply.appendChild(end);
      if (last === run) {  /* not cleared by "New chat" meanwhile */
        if (run.text) history.push({ role: "assistant", content: run.text });
        if (show.checked) renderTokens();
      }
      setBusy(false);
    }
  }

  async function renderTokens() {
    var promptBox = $("prompt-tokens"), replyBox = $("reply-tokens");
    if (!last || !last.promptIds) {
      $("prompt-note").textContent = "Send a message first.";
      promptBox.textContent = replyBox.textContent = $("reply-note").textContent = "";
      return;
    }
    try {
      var prompt = await api("/ui/tokens", { tokens: last.promptIds, messages: last.messages });
      window.turnkitChips.fill(promptBox, prompt.tokens, function (p) {
        var attrs = { "data-origin": p.origin, "data-trained": "0", "data-message": p.message, "data-role": p.role };
        if (p.forged) attrs["data-forged"] = "1";
        return attrs;
      });
      $("prompt-note").textContent = last.promptIds.length + " token ids, from POST /tokenize: the prompt the " +
        "model received" + (prompt.attributed ? "" : " (origin of plain text unknown)") + ".";
      var entries = last.reply;
      var reply = entries.length ? await api("/ui/tokens", { bytes: entries.map(function (e) { return e.bytes; }) })
        : { tokens: [] };
      var index = last.messages.length;
      window.turnkitChips.fill(replyBox, reply.tokens, function (p, n) {
        return { "data-origin": p.control ? "control" : "data", "data-trained": "0", "data-message": index,
          "data-role": "assistant", "data-logprob": entries[n].logprob.toFixed(3) };
      });
      $("reply-note").textContent = entries.length + " generated tokens (finish_reason " + last.finish +
        "; a stop token that ends the reply is not part of it).";
    } catch (err) { say("Cannot show tokens: " + err.message, true); }
  }

  form.addEventListener("submit", chat);
  input.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  stop.addEventListener("click", function () { if (controller) controller.abort(); });
  $("clear").addEventListener("click", function () {
    if (controller) controller.abort();
    history = []; last = null; log.textContent = "";
    $("prompt-tokens").textContent = $("reply-tokens").textContent = "";
    say("");
  });
  show.addEventListener("change", function () { view.hidden = !show.checked; if (show.checked) renderTokens(); });
  $("key").addEventListener("change", loadModels);
  loadModels();
})();
