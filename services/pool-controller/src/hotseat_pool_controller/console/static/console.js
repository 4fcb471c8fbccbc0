// Hotseat web console: plain JavaScript, no dependency, nothing to build (docs/console.md).
// Reads the controller's /v1/pool-updates (server-sent events) and /ui/api/*; changes
// nothing unless the user sends an admin action with the admin token.
"use strict";

const TOKEN_KEY = "hotseat-admin-token";
const TIMELINE_MINUTES = 60;
const ZOOMS = [10, 60, 360];
const TIMELINE_REFRESH_MS = 10000;

const state = {
  info: { pools: [], audit: false, admin: false },
  pools: new Map(), // name -> PoolView
  timelines: new Map(), // name -> Timeline
  lastEpoch: new Map(), // name -> epoch the timeline was last read at
  selected: null, // "pool/index" of the swap whose details are open
  minutes: TIMELINE_MINUTES, // the timeline's window
};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "style") node.setAttribute("style", value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function seconds(value) {
  if (value === null || value === undefined) return "?";
  return value < 10 ? `${value.toFixed(1)} s` : `${Math.round(value)} s`;
}

function clock(iso) {
  const date = new Date(iso);
  return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function notice(text) {
  const node = document.getElementById("notice");
  node.textContent = text || "";
  node.hidden = !text;
}

async function getJson(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

// --- pools ------------------------------------------------------------------------------

function membersOf(view) {
  const known = state.info.pools.find((p) => p.name === view.name);
  return known ? known.members : Object.keys(view.leases);
}

function residentsOf(view) {
  if (view.residents && view.residents.length) return view.residents;
  return view.resident ? [view.resident] : [];
}

function memberState(view, member) {
  if ((view.evicting || []).includes(member)) return "unloading (evicted)";
  if (view.resident === member) return view.closed ? "resident (closed)" : "resident";
  if (residentsOf(view).includes(member)) return "resident";
  if (view.unloading === member) return "unloading";
  if (view.phase === "loading" && view.swapping === member) return "loading";
  if (view.swapping === member) return "next";
  return "";
}

function swapBlock(view) {
  if (!view.swapping) return null;
  const evicting = view.evicting && view.evicting.length ? view.evicting.join(", ") : view.unloading;
  let step = `to ${view.swapping}, once ${view.resident || "the resident"} drains`;
  if (view.phase === "unloading") step = `unloading ${evicting || "the resident"}, then loading ${view.swapping}`;
  else if (view.phase === "loading") step = `loading ${view.swapping}`;
  const children = [el("div", { class: "swap-step", text: `Swap ${step}`, title: view.swap_id ? `swap ${view.swap_id}` : null })];
  if (view.swap_elapsed_s !== null && view.swap_elapsed_s !== undefined) {
    const expected = view.swap_expected_s;
    const ratio = expected ? Math.min(1, view.swap_elapsed_s / expected) : 0;
    const over = expected !== null && expected !== undefined && view.swap_elapsed_s > expected;
    children.push(
      el(
        "div",
        {
          class: over ? "progress over" : "progress",
          role: "progressbar",
          "aria-valuemin": 0,
          "aria-valuemax": 100,
          "aria-valuenow": Math.round(ratio * 100),
        },
        el("div", { style: `width: ${(ratio * 100).toFixed(1)}%` }),
      ),
      el("div", {
        class: "muted swap-time",
        text:
          expected !== null && expected !== undefined
            ? `${seconds(view.swap_elapsed_s)} of ~${seconds(expected)} expected` +
              (view.swap_remaining_s ? `, ~${seconds(view.swap_remaining_s)} left` : "") +
              (over ? " (slower than measured)" : "")
            : `${seconds(view.swap_elapsed_s)} elapsed (no swap measured yet)`,
      }),
    );
  }
  return el("div", { class: "swap", "data-swap-to": view.swapping }, children);
}

function memberRows(view) {
  const queue = view.queue || [];
  return membersOf(view).map((member) => {
    const position = queue.indexOf(member);
    const stateText = memberState(view, member);
    const isResident = residentsOf(view).includes(member);
    const action = isResident
      ? el("button", { type: "button", onclick: () => askAdmin(view.name, "unload", null) }, "Unload")
      : el("button", { type: "button", onclick: () => askAdmin(view.name, "swap", member) }, "Swap in");
    return el(
      "tr",
      {
        "data-member": member,
        "data-leases": view.leases[member] || 0,
        "data-waiters": view.waiters[member] || 0,
        "data-queue": position >= 0 ? position + 1 : "",
      },
      el("td", {}, member),
      el("td", { class: `state-${stateText.split(" ")[0]}`, text: stateText || "-" }),
      el("td", { class: "num", text: view.leases[member] || 0 }),
      el("td", { class: "num waiters", text: view.waiters[member] || 0 }),
      el("td", {
        class: "num hide-narrow",
        title: "place in line; how long its most urgent request counts as having waited (priority included)",
        text: position >= 0 ? `#${position + 1} \u00b7 ${seconds(waited(view, member))}` : "-",
      }),
      el("td", {}, action),
    );
  });
}

function waited(view, member) {
  const value = (view.queue_waited_s || {})[member];
  return value === undefined ? null : value;
}

function flags(view) {
  const out = [];
  if (view.closed) out.push(el("span", { class: "badge flag-closed", title: "the resident takes no new request: another member waited maxWait" }, "closed"));
  if (view.unhealthy) out.push(el("span", { class: "badge flag-unhealthy" }, "unhealthy"));
  if (view.relearning) out.push(el("span", { class: "badge flag-relearning" }, "relearning"));
  return out;
}

function residentLine(view) {
  if (view.capacity_gib !== null && view.capacity_gib !== undefined) {
    const names = residentsOf(view);
    const memory = `${view.free_gib ?? "?"} of ${view.capacity_gib} GiB free`;
    return el(
      "div",
      { class: "resident" },
      names.length ? "Residents: " : "Nothing resident",
      names.map((m, i) => [i ? ", " : "", el("strong", { class: "resident-name" }, m)]),
      el("span", { class: "muted" }, ` \u00b7 ${memory}`),
    );
  }
  if (view.resident) return el("div", { class: "resident" }, "Resident: ", el("strong", { class: "resident-name" }, view.resident));
  if (view.unloading || view.loading) return el("div", { class: "resident muted" }, "Nothing serves while the swap runs");
  return el("div", { class: "resident muted" }, "Nothing resident");
}

function queueLine(view) {
  const queue = view.queue || [];
  if (!queue.length) return null;
  return el(
    "div",
    { class: "queue muted" },
    "Next (most urgent first, priority counted as time waited): ",
    queue
      .map((m, i) => {
        const w = waited(view, m);
        return `${i + 1}. ${m} (${view.waiters[m] || 0} waiting${w === null ? "" : `, ${seconds(w)}`})`;
      })
      .join(", "),
  );
}

function renderPool(view) {
  const id = `pool-${view.name}`;
  let card = document.getElementById(id);
  const fresh = el(
    "article",
    {
      class: "pool",
      id,
      "data-pool": view.name,
      "data-phase": view.phase,
      "data-resident": view.resident || "",
      "data-residents": residentsOf(view).join(" "),
      "data-epoch": view.epoch,
    },
    el(
      "div",
      { class: "pool-head" },
      el("h2", {}, view.name),
      el("span", { class: `badge phase-${view.phase}`, title: "phase" }, view.phase),
      el("span", { class: "muted" }, `epoch ${view.epoch}`),
      flags(view),
    ),
    residentLine(view),
    swapBlock(view),
    queueLine(view),
    el(
      "div",
      { class: "members-wrap" },
      el(
        "table",
        { class: "members" },
        el(
          "thead",
          {},
          el(
            "tr",
            {},
            el("th", {}, "member"),
            el("th", {}, "state"),
            el("th", { class: "num" }, "leases"),
            el("th", { class: "num" }, "waiters"),
            el("th", { class: "num hide-narrow" }, "queue"),
            el("th", {}, "admin"),
          ),
        ),
        el("tbody", {}, memberRows(view)),
      ),
    ),
    renderTimeline(view.name),
  );
  if (card) card.replaceWith(fresh);
  else document.getElementById("pools").append(fresh);
}

// --- model groups -----------------------------------------------------------------------

function placementLine(group) {
  if (!group.placed) return el("div", { class: "placement muted" }, "No placement yet");
  return el(
    "div",
    { class: "placement", title: group.placed_ms ? `at ${clock(new Date(group.placed_ms).toISOString())}` : null },
    `placed: ${group.placed}, reason: ${group.reason || "?"}`,
    group.placed_ms ? el("span", { class: "muted" }, ` \u00b7 ${clock(new Date(group.placed_ms).toISOString())}`) : null,
  );
}

function renderGroup(group) {
  const copies = group.members || [];
  const rows = copies.map((c) =>
    el(
      "tr",
      {
        "data-copy": c.pool,
        "data-status": c.status,
        "data-leases": c.leases,
        "data-slots": c.slots,
        "data-waiting": c.waiting,
        class: group.placed === c.pool ? "placed" : null,
      },
      el("td", {}, c.pool),
      el("td", {}, c.member),
      el("td", { class: `state-${c.status}`, text: c.status }),
      el("td", { class: "num", title: "live leases through the group / requests one copy serves at once", text: `${c.leases}/${c.slots}` }),
      el("td", { class: "num waiters", text: c.waiting }),
    ),
  );
  return el(
    "article",
    { class: "group", id: `group-${group.name}`, "data-group": group.name, "data-placed": group.placed || "", "data-reason": group.reason || "" },
    el(
      "div",
      { class: "pool-head" },
      el("h2", {}, group.name),
      el("span", { class: "badge" }, "model group"),
      el("span", { class: "muted" }, `${group.copies.length} resident, ${group.loading.length} loading`),
    ),
    placementLine(group),
    el(
      "div",
      { class: "members-wrap" },
      el(
        "table",
        { class: "copies" },
        el(
          "thead",
          {},
          el(
            "tr",
            {},
            el("th", {}, "pool"),
            el("th", {}, "member"),
            el("th", {}, "copy"),
            el("th", { class: "num" }, "leases/slots"),
            el("th", { class: "num" }, "waiting"),
          ),
        ),
        el("tbody", {}, rows),
      ),
    ),
  );
}

function renderGroups(groups) {
  const section = document.getElementById("groups");
  section.hidden = !groups.length;
  section.replaceChildren(...(groups.length ? [el("h2", {}, "Model groups")] : []), ...groups.map(renderGroup));
}

// --- timeline ---------------------------------------------------------------------------

function percent(iso, since, span) {
  return Math.max(0, Math.min(100, ((new Date(iso).getTime() - since) / span) * 100));
}

function positioned(cls, startIso, endIso, since, span, attrs, ...children) {
  const left = percent(startIso, since, span);
  const right = percent(endIso, since, span);
  return el(cls === "swap-bar" ? "button" : "div", {
    class: cls,
    style: `left: ${left.toFixed(3)}%; width: ${Math.max(0, right - left).toFixed(3)}%`,
    ...attrs,
  }, ...children);
}

function describeSwap(swap) {
  const what = `${swap.from_member || "(nothing)"} \u2192 ${swap.to_member || "(nothing)"}`;
  const took = swap.duration_ms !== null && swap.duration_ms !== undefined ? `${(swap.duration_ms / 1000).toFixed(1)} s` : swap.outcome === "in_flight" ? "running" : "";
  const end = swap.outcome === "swap_completed" || swap.outcome === "in_flight" ? "" : ` ${swap.outcome.replace("swap_", "")}`;
  return `${clock(swap.started)} ${what} \u00b7 ${swap.reason || "?"}${end} \u00b7 ${took} \u00b7 ${swap.waiters_total} waiter${swap.waiters_total === 1 ? "" : "s"}`;
}

function swapDetails(swap) {
  const phases = [
    swap.unload_ms !== null && swap.unload_ms !== undefined ? `unload ${(swap.unload_ms / 1000).toFixed(1)} s` : null,
    swap.load_ms !== null && swap.load_ms !== undefined ? `load ${(swap.load_ms / 1000).toFixed(1)} s` : null,
  ].filter(Boolean);
  let cause = `cause: ${swap.reason || "unknown"}`;
  if (swap.cause) {
    cause = `caused by request ${swap.cause.request_id || "?"} (rule ${swap.cause.rule || "-"}, arrived ${clock(swap.cause.started)})`;
  } else if (swap.cause_request_id) {
    cause = `caused by request ${swap.cause_request_id}`;
  }
  if (phases.length) cause += ` \u00b7 ${phases.join(", ")}`;
  if (swap.swap_id) cause += ` \u00b7 swap ${swap.swap_id}`;
  return el(
    "details",
    {},
    el("summary", {}, cause),
    el(
      "ul",
      { class: "waiters" },
      swap.waiters.map((w) =>
        el("li", { "data-request": w.request_id || "" }, `${w.request_id || "?"} \u00b7 ${w.rule || "-"} \u00b7 ${w.outcome} \u00b7 ${w.duration_ms !== null && w.duration_ms !== undefined ? (w.duration_ms / 1000).toFixed(1) + " s" : ""}`),
      ),
      swap.waiters_total > swap.waiters.length ? el("li", {}, `and ${swap.waiters_total - swap.waiters.length} more`) : null,
    ),
  );
}

function renderTimeline(pool) {
  const timeline = state.timelines.get(pool);
  const zoom = el(
    "span",
    { class: "zoom" },
    ZOOMS.map((m) =>
      el(
        "button",
        {
          type: "button",
          "aria-pressed": String(state.minutes === m),
          onclick: () => {
            state.minutes = m;
            state.selected = null;
            for (const name of state.pools.keys()) refreshTimeline(name);
          },
        },
        m < 60 ? `${m} min` : `${m / 60} h`,
      ),
    ),
  );
  const title = state.minutes < 60 ? `Last ${state.minutes} minutes` : state.minutes === 60 ? "Last hour" : `Last ${state.minutes / 60} hours`;
  const box = el("div", { class: "timeline", "data-timeline": pool }, el("h3", {}, title, zoom));
  if (!state.info.audit) {
    box.append(el("p", { class: "muted" }, "The timeline needs the audit service: start the controller with HOTSEAT_AUDIT_URL."));
    return box;
  }
  if (!timeline) {
    box.append(el("p", { class: "muted" }, "loading"));
    return box;
  }
  if (timeline.audit_error) box.append(el("p", { class: "error" }, timeline.audit_error));
  const since = new Date(timeline.since).getTime();
  const span = Math.max(1, new Date(timeline.until).getTime() - since);
  const view = state.pools.get(pool);
  const members = view ? membersOf(view) : [...new Set(timeline.residency.map((r) => r.member))];
  for (const member of members) {
    const spans = timeline.residency.filter((r) => r.member === member);
    box.append(
      el(
        "div",
        { class: "track-row" },
        el("span", { title: member }, member),
        el(
          "div",
          { class: "track", "data-track": member },
          spans.map((r) =>
            positioned("span", r.start, r.end, since, span, { title: `${member} resident ${clock(r.start)}\u2013${clock(r.end)}`, "data-member": member }),
          ),
        ),
      ),
    );
  }
  const swaps = timeline.swaps;
  box.append(
    el(
      "div",
      { class: "track-row" },
      el("span", {}, "swaps"),
      el(
        "div",
        { class: "track swaps" },
        swaps.map((s, i) =>
          positioned("swap-bar", s.started, s.ended || timeline.until, since, span, {
            type: "button",
            title: describeSwap(s),
            "aria-label": describeSwap(s),
            "data-epoch": s.epoch,
            "data-swap-id": s.swap_id,
            "data-to": s.to_member || "",
            "data-outcome": s.outcome,
            "data-waiters": s.waiters_total,
            onclick: () => {
              state.selected = `${pool}/${i}`;
              const item = document.querySelector(`[data-swap-item="${pool}/${i}"]`);
              if (item) {
                document.querySelectorAll(".swap-list li.selected").forEach((n) => n.classList.remove("selected"));
                item.classList.add("selected");
                const details = item.querySelector("details");
                if (details) details.open = true;
                item.scrollIntoView({ block: "nearest" });
              }
            },
          }),
        ),
      ),
    ),
    el("div", { class: "axis" }, el("span", {}, clock(timeline.since)), el("span", {}, clock(timeline.until))),
  );
  const list = el("ol", { class: "swap-list", reversed: true });
  swaps.forEach((s, i) => {
    const key = `${pool}/${i}`;
    list.prepend(
      el(
        "li",
        { "data-swap-item": key, "data-outcome": s.outcome, "data-to": s.to_member || "", class: state.selected === key ? "selected" : null },
        describeSwap(s),
        swapDetails(s),
      ),
    );
  });
  if (!swaps.length) list.append(el("li", { class: "muted" }, "No swap in the window."));
  box.append(list);
  if (timeline.truncated) box.append(el("p", { class: "muted" }, "More events than the console reads: the oldest are left out."));
  return box;
}

async function refreshTimeline(pool) {
  if (!state.info.audit) return;
  try {
    state.timelines.set(pool, await getJson(`/ui/api/timeline/${encodeURIComponent(pool)}?minutes=${state.minutes}`));
  } catch (error) {
    state.timelines.set(pool, { since: new Date(Date.now() - state.minutes * 60000).toISOString(), until: new Date().toISOString(), residency: [], swaps: [], audit_error: String(error) });
  }
  const view = state.pools.get(pool);
  if (view) renderPool(view);
}

// --- outcomes ---------------------------------------------------------------------------

async function refreshOutcomes() {
  const body = document.getElementById("outcomes-body");
  if (!state.info.audit) {
    body.textContent = "Needs the audit service: start the controller with HOTSEAT_AUDIT_URL.";
    return;
  }
  let outcomes;
  try {
    outcomes = await getJson(`/ui/api/outcomes?minutes=${TIMELINE_MINUTES}`);
  } catch (error) {
    body.textContent = String(error);
    return;
  }
  if (outcomes.audit_error) {
    body.textContent = outcomes.audit_error;
    return;
  }
  if (!outcomes.rules.length) {
    body.textContent = "No request in the last hour.";
    return;
  }
  const rows = outcomes.rules.map((r) =>
    el(
      "tr",
      { "data-rule": r.rule || "" },
      el("td", {}, r.rule || "(no rule)"),
      el("td", { class: "num" }, r.total),
      el("td", { class: "num" }, r.by_outcome.served || 0),
      el("td", {}, Object.entries(r.by_outcome).filter(([o]) => o !== "served").map(([o, n]) => `${o} ${n}`).join(", ") || "-"),
    ),
  );
  body.replaceChildren(
    el(
      "div",
      { class: "members-wrap" },
      el(
        "table",
        { class: "outcomes" },
        el("thead", {}, el("tr", {}, el("th", {}, "rule"), el("th", { class: "num" }, "requests"), el("th", { class: "num" }, "served"), el("th", {}, "other outcomes"))),
        el("tbody", {}, rows),
      ),
    ),
  );
}

// --- admin ------------------------------------------------------------------------------

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function showAdminState() {
  const button = document.getElementById("admin");
  const unlocked = Boolean(token());
  button.dataset.unlocked = String(unlocked);
  button.textContent = unlocked ? "admin: token set (forget)" : "admin: locked";
}

let pendingAction = null;

function askAdmin(pool, action, member) {
  pendingAction = { pool, action, member };
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-title").textContent = action === "swap" ? `Swap ${pool} to ${member}` : `Unload ${pool}`;
  document.getElementById("token-what").textContent = state.info.admin
    ? "Sent to the controller's admin API with your admin token (kept in this tab only)."
    : "The controller has no admin token configured: admin actions are disabled.";
  document.getElementById("token-input").value = token() || "";
  document.getElementById("token-force").checked = false;
  const error = document.getElementById("token-error");
  error.hidden = true;
  error.textContent = "";
  dialog.showModal();
}

async function sendAdmin(event) {
  event.preventDefault();
  if (!pendingAction) return;
  const { pool, action, member } = pendingAction;
  const value = document.getElementById("token-input").value.trim();
  const force = document.getElementById("token-force").checked;
  const body = action === "swap" ? { member, force } : { force };
  const error = document.getElementById("token-error");
  let response;
  try {
    response = await fetch(`/v1/pools/${encodeURIComponent(pool)}/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${value}` },
      body: JSON.stringify(body),
    });
  } catch (failure) {
    error.textContent = String(failure);
    error.hidden = false;
    return;
  }
  if (response.status === 401 || response.status === 403) {
    sessionStorage.removeItem(TOKEN_KEY);
    showAdminState();
    const detail = await response.json().catch(() => ({}));
    error.textContent = `${response.status}: ${detail.detail || "refused"}`;
    error.hidden = false;
    error.dataset.status = String(response.status);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, value);
  showAdminState();
  const result = await response.json().catch(() => ({}));
  if (!response.ok) {
    error.textContent = `${response.status}: ${result.detail || "refused"}`;
    error.hidden = false;
    error.dataset.status = String(response.status);
    return;
  }
  document.getElementById("token-dialog").close();
  notice(result.status === "started" ? `${action} of ${pool} started (epoch ${result.epoch})` : `${action} of ${pool}: nothing to do`);
  pendingAction = null;
}

// --- live stream ------------------------------------------------------------------------

function onPools(list) {
  const live = document.getElementById("live");
  live.dataset.state = "live";
  live.textContent = "live";
  notice("");
  renderGroups(list.groups || []);
  for (const view of list.pools) {
    const before = state.pools.get(view.name);
    state.pools.set(view.name, view);
    renderPool(view);
    const moved = !before || before.epoch !== view.epoch || before.phase !== view.phase;
    if (moved) {
      // The audit service stores events a moment after they happen: read again shortly.
      refreshTimeline(view.name);
      setTimeout(() => refreshTimeline(view.name), 3000);
    }
  }
}

function connect() {
  const source = new EventSource("/v1/pool-updates");
  const live = document.getElementById("live");
  source.addEventListener("pools", (event) => onPools(JSON.parse(event.data)));
  source.addEventListener("unavailable", (event) => {
    live.dataset.state = "down";
    live.textContent = "store down";
    notice(`The controller cannot read its pools: ${JSON.parse(event.data).error}`);
  });
  source.addEventListener("error", () => {
    live.dataset.state = "down";
    live.textContent = "reconnecting";
  });
}

async function start() {
  document.getElementById("admin").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showAdminState();
  });
  document.getElementById("token-form").addEventListener("submit", sendAdmin);
  document.getElementById("token-cancel").addEventListener("click", () => document.getElementById("token-dialog").close());
  showAdminState();
  try {
    state.info = await getJson("/ui/api/info");
  } catch (error) {
    notice(`Cannot reach the controller: ${error}`);
  }
  connect();
  refreshOutcomes();
  setInterval(() => {
    for (const pool of state.pools.keys()) refreshTimeline(pool);
    refreshOutcomes();
  }, TIMELINE_REFRESH_MS);
}

start();
