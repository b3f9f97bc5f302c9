// The approval inbox: the token's tenant's pending approvals and questions, decided through /v1/approvals.
// Plain JS, no build step. The token stays in this tab (sessionStorage); a link may carry it in the URL
// fragment (#token=...), which never reaches a server and is removed from the address bar at once.
"use strict";

const state = { token: "", me: null, streams: new Map(), refreshing: null };
const $ = (sel, root = document) => root.querySelector(sel);

function takeToken() {
  const match = /(?:^|&)token=([^&]+)/.exec(location.hash.slice(1));
  if (match) {
    sessionStorage.setItem("agent-api-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("agent-api-token") || "";
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || body);
    throw new Error(`${response.status}: ${detail}`);
  }
  return body;
}

function say(text) {
  $("#status").textContent = text;
}

function runLink(workflowId) {
  const me = state.me;
  if (!me || !me.ui_url) return "";
  return `${me.ui_url}/namespaces/${encodeURIComponent(me.namespace)}/workflows/${encodeURIComponent(workflowId)}`;
}

function render(approvals) {
  const main = $("#approvals");
  const seen = new Set();
  for (const item of approvals) {
    const key = `${item.workflow_id}/${item.approval_id}`;
    seen.add(key);
    if (main.querySelector(`[data-key="${CSS.escape(key)}"]`)) continue; // keep what a reviewer is typing
    main.appendChild(card(item, key));
  }
  for (const node of main.querySelectorAll(".approval")) {
    if (!seen.has(node.dataset.key) && !node.dataset.decided) node.remove();
  }
  $(".empty", main)?.remove();
  if (!main.querySelector(".approval")) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.textContent = "Nothing waits for a decision.";
    main.appendChild(empty);
  }
}

function card(item, key) {
  const node = $("#card").content.firstElementChild.cloneNode(true);
  node.dataset.key = key;
  node.dataset.workflowId = item.workflow_id;
  node.dataset.approvalId = item.approval_id;
  const question = item.kind === "question";
  $(".tool", node).textContent = question ? "question" : item.tool;
  $(".kind", node).textContent = item.kind.replace("_", " ");
  const link = $(".run", node);
  link.textContent = item.workflow_id;
  const href = runLink(item.workflow_id);
  if (href) link.href = href;
  $(".question", node).textContent = item.question || "";
  $(".question", node).hidden = !question;
  $(".args", node).textContent = JSON.stringify(item.edited_args || item.args, null, 2);
  $(".args", node).hidden = question;
  $(".rule", node).textContent = item.rule || "-";
  $(".step", node).textContent = String(item.step);
  $(".expires", node).textContent = new Date(item.expires_at).toLocaleString();
  $(".reviewers", node).textContent = (item.reviewers || []).join(", ") || "anyone";
  $(".call-actions", node).hidden = question;
  $(".question-actions", node).hidden = !question;
  for (const option of item.options || []) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "option";
    button.textContent = option;
    button.addEventListener("click", () => decide(node, { decision: "answer", text: option }));
    $(".options", node).appendChild(button);
  }
  $(".approve", node).addEventListener("click", () => decide(node, { decision: "approve" }));
  $(".reject", node).addEventListener("click", () =>
    decide(node, { decision: "reject", reason: $(".reason", node).value.trim() }),
  );
  $(".edit", node).addEventListener("click", () => {
    $(".edited", node).value = JSON.stringify(item.edited_args || item.args, null, 2);
    $(".editor", node).hidden = false;
  });
  $(".save-edit", node).addEventListener("click", () => {
    let args;
    try {
      args = JSON.parse($(".edited", node).value);
    } catch (err) {
      $(".result", node).textContent = `not JSON: ${err.message}`;
      return;
    }
    decide(node, { decision: "approve", arguments: args });
  });
  $(".answer", node).addEventListener("click", () =>
    decide(node, { decision: "answer", text: $(".answer-text", node).value }),
  );
  return node;
}

async function decide(node, body) {
  for (const button of node.querySelectorAll("button")) button.disabled = true;
  const path = `/v1/approvals/${encodeURIComponent(node.dataset.workflowId)}/${encodeURIComponent(node.dataset.approvalId)}`;
  try {
    const done = await api(path, { method: "POST", body: JSON.stringify(body) });
    node.dataset.decided = "1";
    node.classList.add("decided");
    $(".result", node).textContent = done.message;
  } catch (err) {
    $(".result", node).textContent = err.message;
    for (const button of node.querySelectorAll("button")) button.disabled = false;
  }
}

async function refresh() {
  if (state.refreshing) return state.refreshing;
  state.refreshing = (async () => {
    try {
      const { approvals } = await api("/v1/approvals");
      render(approvals);
      follow(new Set(approvals.map((a) => a.workflow_id)));
      say(`${approvals.length} waiting · updated ${new Date().toLocaleTimeString()}`);
    } catch (err) {
      say(err.message);
    } finally {
      state.refreshing = null;
    }
  })();
  return state.refreshing;
}

// Each run with something pending is followed on its event stream; any event refreshes the list.
// fetch, not EventSource: EventSource cannot send the Authorization header.
function follow(runs) {
  for (const [id, controller] of state.streams) {
    if (!runs.has(id)) {
      controller.abort();
      state.streams.delete(id);
    }
  }
  for (const id of runs) {
    if (!state.streams.has(id)) state.streams.set(id, stream(id));
  }
}

function stream(workflowId) {
  const controller = new AbortController();
  (async () => {
    let cursor = "";
    while (!controller.signal.aborted) {
      try {
        const headers = { Authorization: `Bearer ${state.token}` };
        if (cursor) headers["Last-Event-ID"] = cursor;
        const response = await fetch(`/v1/runs/${encodeURIComponent(workflowId)}/events`, {
          headers,
          signal: controller.signal,
        });
        if (!response.ok) break;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            const id = /^id: (.*)$/m.exec(block);
            if (id) cursor = id[1];
            if (/^event: (?!delta$)/m.test(block)) refresh();
            if (/^event: end$/m.test(block)) return;
          }
        }
      } catch (err) {
        if (controller.signal.aborted) return;
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  })();
  return controller;
}

async function start() {
  state.token = takeToken();
  if (!state.token) {
    $("#login").hidden = false;
    $("#login").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem("agent-api-token", $("#token").value.trim());
      location.reload();
    });
    return;
  }
  try {
    state.me = await api("/v1/me");
    $("#who").textContent = `${state.me.reviewer || "?"} · tenant ${state.me.tenant || "all"}`;
  } catch (err) {
    say(err.message);
    sessionStorage.removeItem("agent-api-token");
    return;
  }
  await refresh();
  setInterval(refresh, 5000); // a safety net: streams carry the live updates
}

start();
