// Search (#/search?state=&customerId=&workflow=&failedStep=&createdFrom=&createdTo=): GET /api/orders, paged by
// continuation token.

import { bulkBar } from "./bulk.js";
import { h, setChildren } from "./dom.js";
import { COLUMNS, pagedOrders } from "./orderlist.js";

const STATES = ["", "inFlight", "attention", "processed", "error"];
const FILTERS = ["state", "customerId", "workflow", "failedStep", "createdFrom", "createdTo"];
const ORDER_ID = /^([0-9a-fA-F]{32}|[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12})$/;

/** Whether `text` is an order id (32 hex digits, or a UUID with dashes). */
export function isOrderId(text) {
  return ORDER_ID.test(text);
}

/** The route of an order's page, from its id in either form. */
export function orderRoute(id) {
  return `#/orders/${id.replaceAll("-", "").toLowerCase()}`;
}

/** The search page's route for these filters ({customerId: "c-1", state: ...}; empty ones left out). */
export function searchRoute(filters) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(filters)) {
    if (value) params.set(name, value);
  }
  return `#/search?${params}`;
}

export function render(main, ctx, query) {
  const field = (label, input) => h("label", {}, h("span", {}, label), input);
  const idInput = h("input", { name: "id", placeholder: "32 hex digits or a UUID", size: 36, autocomplete: "off" });
  const customer = h("input", { name: "customerId", value: query.get("customerId") || "", placeholder: "c-1" });
  const workflow = h("input", { name: "workflow", value: query.get("workflow") || "", placeholder: "order" });
  const failedStep = h("input", { name: "failedStep", value: query.get("failedStep") || "",
    placeholder: "charge-payment" });
  const state = h("select", { name: "state" }, STATES.map((value) =>
    h("option", { value, selected: value === (query.get("state") || "") }, value || "any")));
  const from = h("input", { name: "createdFrom", type: "datetime-local", step: 1, value: localValue(query.get("createdFrom")) });
  const to = h("input", { name: "createdTo", type: "datetime-local", step: 1, value: localValue(query.get("createdTo")) });
  const idError = h("p", { class: "error", role: "alert", hidden: true });
  const results = h("div", { dataset: { testid: "search-results" } });

  const form = h("form", { class: "search", onsubmit: (event) => {
    event.preventDefault();
    const id = idInput.value.trim();
    if (id) {
      if (!isOrderId(id)) {
        idError.hidden = false;
        setChildren(idError, "An order id is 32 hexadecimal digits, or a UUID with dashes.");
        return;
      }
      window.location.hash = orderRoute(id);
      return;
    }
    window.location.hash = searchRoute({
      customerId: customer.value.trim(), state: state.value,
      workflow: workflow.value.trim(), failedStep: failedStep.value.trim(),
      createdFrom: from.value ? isoValue(from.value) : "", createdTo: to.value ? isoValue(to.value) : "",
      limit: query.get("limit"),
    });
  } },
  field("Order id", idInput), field("Customer", customer), field("Category", state),
  field("Workflow", workflow), field("Failed step", failedStep),
  field("Created from (UTC)", from), field("Created before (UTC)", to),
  h("button", { type: "submit" }, "Search"));

  const params = {};
  for (const name of FILTERS) {
    if (query.get(name)) params[name] = query.get(name);
  }
  let paged = null;
  // "Retry all N" over this search's filter (bulk.js); when it is done, the results are read again
  const bulk = bulkBar(ctx, params, () => paged && paged.reload());
  setChildren(main, h("h1", {}, "Search"), form, idError, bulk, results);
  const limit = Number(query.get("limit")) || 25;
  paged = pagedOrders(results, ctx, { ...params, limit }, [COLUMNS.id, COLUMNS.state, COLUMNS.category,
    COLUMNS.outcome, COLUMNS.customer, COLUMNS.failureCount, COLUMNS.created, COLUMNS.updated]);
}

/** "2026-11-23T15:00:00Z" -> "2026-11-23T15:00:00" for a datetime-local input (shown as UTC). */
function localValue(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? "" : date.toISOString().slice(0, 19);
}

/** A datetime-local value, read as UTC -> ISO with Z. */
function isoValue(local) {
  return (local.length === 16 ? `${local}:00` : local) + "Z";
}
