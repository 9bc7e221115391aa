// The console's router: hash routes -> views. Each view renders into <main> and may return a clean-up.
// A route works however it is reached: a click, typed into the address bar, or a reload (the page
// routes its hash on load and on every change). The header's tab of the view is highlighted; an
// order's page belongs to no tab (it is reached from several), so none is.

import { loadCaller } from "./api.js";
import * as attention from "./attention.js";
import * as deadletters from "./deadletters.js";
import { errorBox, h, setChildren } from "./dom.js";
import * as order from "./order.js";
import * as overview from "./overview.js";
import * as search from "./search.js";
import * as webhooks from "./webhooks.js";

const ROUTES = [
  [/^\/$/, overview.render, "overview"],
  [/^\/attention$/, attention.render, "attention"],
  [/^\/search$/, search.render, "search"],
  [/^\/orders\/([^/]+)$/, order.render, null],
  [/^\/deadletters\/([^/]+)$/, deadletters.render, "deadletters"],
  [/^\/webhooks$/, webhooks.render, "webhooks"],
];
// Paths that name a section but not one of its pages: the address is replaced by its first page.
const SECTIONS = { "/deadletters": "/deadletters/scheduler", "/orders": "/search" };

const main = document.getElementById("main");
let cleanup = null;
let generation = 0;

function route() {
  const hash = window.location.hash.replace(/^#/, "") || "/";
  const [raw, queryString] = hash.split("?", 2);
  const path = `/${raw.replace(/^\/+|\/+$/g, "")}`; // "attention", "/attention/" -> "/attention"
  if (SECTIONS[path]) {
    window.history.replaceState(null, "", `#${SECTIONS[path]}${queryString ? `?${queryString}` : ""}`);
    route();
    return;
  }
  if (cleanup) cleanup();
  cleanup = null;
  generation += 1;
  const mine = generation;
  const ctx = { alive: () => mine === generation };
  for (const [pattern, render, nav] of ROUTES) {
    const match = pattern.exec(path);
    if (!match) continue;
    markNav(nav);
    try {
      const params = match.slice(1).map(decodeURIComponent); // may throw on a malformed %-escape
      cleanup = render(main, ctx, new URLSearchParams(queryString || ""), ...params) || null;
    } catch (error) {
      setChildren(main, errorBox("The console failed to show this page", error));
    }
    main.focus({ preventScroll: true });
    return;
  }
  markNav(null);
  setChildren(main, h("h1", {}, "Not found"), h("p", {}, "No view at ", h("code", {}, hash), ". ",
    h("a", { href: "#/" }, "Overview")));
}

function markNav(name) {
  for (const link of document.querySelectorAll("header nav a")) {
    if (link.dataset.nav === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

document.getElementById("skip").addEventListener("click", () => main.focus());
// Who is looking first (a viewer is offered no action: GET /api/console/caller, which costs no
// Service Bus operation); then one route per address: a link followed meanwhile is routed once,
// when the caller is known, not twice.
loadCaller().finally(() => {
  window.addEventListener("hashchange", route);
  route();
});
