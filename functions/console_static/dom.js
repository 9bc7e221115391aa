// Building the page from data: elements and text nodes only, never markup parsed from strings.

/** h("a", {href: "#/", class: "x", dataset: {testid: "y"}}, "text", child, [more]) -> Element */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style" && typeof value === "object") Object.assign(el.style, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = String(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/** Replace an element's children. */
export function setChildren(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/**
 * A table: headers, then rows of cells (strings or nodes); a row may be {attrs, cells} (the row's
 * attributes), and a cell {attrs, content} (the cell's, e.g. a colspan).
 */
export function table(headers, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", { scope: "col" }, name)))),
    h("tbody", {}, rows.map((row) => {
      const [rowAttrs, cells] = Array.isArray(row) ? [{}, row] : [row.attrs, row.cells];
      return h("tr", rowAttrs, cells.map((cell) => (isCellWithAttrs(cell) ? h("td", cell.attrs, cell.content)
        : h("td", {}, cell))));
    })));
}

function isCellWithAttrs(cell) {
  return cell !== null && typeof cell === "object" && !Array.isArray(cell) && !(cell instanceof Node) && "content" in cell;
}

/** An error box (role=alert) saying what failed and why. */
export function errorBox(what, error) {
  return h("div", { class: "error", role: "alert", dataset: { testid: "error" } },
    h("strong", {}, what + ": "), describeError(error));
}

export function describeError(error) {
  if (error && error.status) return `${error.status} ${error.message}`;
  return error && error.message ? error.message : String(error);
}

/** "1000+" for a capped count. */
export function capped(count, isCapped) {
  return isCapped ? `${count}+` : String(count);
}

/** "2026-11-23 19:00:05Z" (UTC, to the second) from an ISO string; "—" for none. */
export function fmtTime(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

/** "4 s", "3 min", "2 h 5 min", "3 d 4 h". */
export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** "08:30:24Z" of an ISO time (the time of day, UTC). */
export function clock(iso) {
  return fmtTime(iso).slice(11);
}

/** "in 4 s" or "4 s ago": an ISO time from `from` (an ISO time or epoch ms; default the browser's now). */
export function relative(iso, from = Date.now()) {
  const base = typeof from === "string" ? Date.parse(from) : from;
  const seconds = (Date.parse(iso) - base) / 1000;
  if (Number.isNaN(seconds)) return "—";
  return seconds >= 0 ? `in ${fmtDuration(seconds)}` : `${fmtDuration(-seconds)} ago`;
}

/** Seconds since an ISO time (null if none). */
export function ageSeconds(iso, now = Date.now()) {
  if (!iso) return null;
  const t = Date.parse(iso);
  return Number.isNaN(t) ? null : (now - t) / 1000;
}

/**
 * The digits of `currency`'s minor unit (ISO 4217: EUR and USD 2, JPY 0, BHD 3), as the browser's
 * Intl.NumberFormat knows them; 2 for a code it cannot format.
 */
export function minorDigits(currency) {
  try {
    return new Intl.NumberFormat("en", { style: "currency", currency }).resolvedOptions().maximumFractionDigits;
  } catch {
    return 2;
  }
}

/**
 * An amount (the API's decimal string, e.g. "0.2") written to its currency's minor unit: "0.20 EUR",
 * "19.98 EUR", "1500 JPY". Worked on the digits, never through a float; digits beyond the minor
 * unit are kept, not rounded away ("0.1234 EUR": the API takes up to 4 decimal places). "—" for no
 * amount; an amount that is not a decimal is shown as given.
 */
export function fmtMoney(amount, currency) {
  if (amount === null || amount === undefined || amount === "") return "—";
  const text = String(amount);
  const code = currency ? ` ${currency}` : "";
  const match = /^(\d+)(?:\.(\d+))?$/.exec(text);
  if (!match || !currency) return `${text}${code}`;
  const digits = minorDigits(currency);
  const fraction = (match[2] || "").replace(/0+$/, "").padEnd(digits, "0");
  return `${match[1]}${fraction ? `.${fraction}` : ""}${code}`;
}

export function orderLink(orderId) {
  return h("a", { href: `#/orders/${encodeURIComponent(orderId)}`, class: "mono" }, orderId);
}
