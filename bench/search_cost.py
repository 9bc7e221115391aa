"""What a search page costs (``GET /api/orders``) with 1,000 and 100,000 finished orders: the
search phase of ``python -m bench`` (``--search-sizes``; about 2 minutes).

On an Azurite of its own, seeded in the app's row layout (``bench.search_seed``: a few orders that
need an operator or are in flight, then finished orders up to each size, bulk-loaded past
``API_SEEDING_MAX``), it calls ``shared.api.search.search_orders`` on the app's ``TableStore``
through a transport that counts every request (``bench.opcount``'s classification): for each
filter of :func:`queries`, a page of ``PAGE``: its entities read and requests (the same on every
call: checked) and the latency over ``repeats`` calls; at the smallest size also a full page of
orders that need an operator (each a state read). At each size, the console's overview
(``shared.console.overview.get_overview``) with the stats rows of ``STATS_PROCESSES`` processes
over ``STATS_HOURS`` hours. The latency is Azurite's, which scans a whole table per query (Table
Storage seeks the key range); the entities and requests are the app's.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.figures import pyplot, save
from bench.opcount import Counter, count_request, is_read, kind_of
from bench.search_seed import (
    BIG_CUSTOMER,
    INDEX_BATCH,
    bulk_load,
    index_entities,
    live_order,
    seed_api,
    seed_live,
)
from shared.core.workflows.catalog import AGENTS
from shared.settings import TOKEN_KEYS, new_token_key
from shared.storage.store import SEARCH_SHARDS, first_share, index_partitions

PAGE = 50
BOUND_ENTITIES = 60  # issue 11: "a page of 50 reads at most about 60 entities" (the index in one partition)


def bound_entities(shards: int = SEARCH_SHARDS) -> int:
    """Issue 11's bound for the search index in ``shards`` partitions (``SEARCH_SHARDS``): a page's
    first round reads each partition's share (``first_share``, the legacy one's too), a second round
    at most about the page again from the shards that drew more than their share (``merge_lazily``),
    and the same 9 state point reads as in one partition. 150 at 8 shards: a page is still a bound
    that does not grow with the table; reading every shard whole would be 9 x 51 = 459."""
    partitions = len(index_partitions(shards))
    if partitions == 1:
        return BOUND_ENTITIES
    return partitions * first_share(PAGE + 1, partitions) + PAGE + 1 + (BOUND_ENTITIES - PAGE - 1)
LIVE_ORDERS = {"held": 3, "failed": 2, "inFlight": 5}
ATTENTION_FULL = 55  # more failed orders: 60 in attention, a full page of 50 and a next one
API_SEEDING_MAX = 5000
TABLES = ("orders", "deadlines", "orderindex")
STATS_PROCESSES = 4  # processes whose stats rows the overview merges (say 2 instances x 2 workers)
STATS_HOURS = 48  # of stats rows seeded before the run (what retention keeps)
# every agent's (required), and a token key of this run's own
SETTINGS = {**{a.service_url_setting: f"http://127.0.0.1:9/{a.name}" for a in AGENTS}, TOKEN_KEYS: new_token_key()}
Progress = Callable[[str], None]


# ---- measuring ---------------------------------------------------------------------------------
def queries(now: datetime) -> list[tuple[str, dict[str, str]]]:
    """(name, query parameters) of each measured page."""
    lim = {"limit": str(PAGE)}
    return [
        ("state=attention", {"state": "attention", **lim}),
        ("state=inFlight", {"state": "inFlight", **lim}),
        ("state=processed", {"state": "processed", **lim}),
        ("state=processed, page 2", {"state": "processed", **lim, "page": "2"}),
        ("no filter", dict(lim)),
        (f"customerId={BIG_CUSTOMER}", {"customerId": BIG_CUSTOMER, **lim}),
        ("created range (2 days)", {"createdFrom": (now - timedelta(days=10)).isoformat(),
                                    "createdTo": (now - timedelta(days=8)).isoformat(), **lim}),
    ]


class CountedStore:
    """The app's ``TableStore`` and a ``Runtime`` on it, every table request counted."""

    def __init__(self, connection_string: str, state_table: str, deadline_table: str, index_table: str) -> None:
        from shared.core.statemachine import Config
        from shared.messaging import MemoryBus
        from shared.runtime import Runtime
        from shared.runtime.clients import table_service_client
        from shared.settings import Settings
        from shared.storage.table_store import TableStore
        from shared.storage.tables import requests_transport

        self.counter = Counter(None)
        transport = requests_transport()
        send = transport.send

        def counted(request: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            response = send(request, **kwargs)
            count_request(self.counter, request, response, time.perf_counter() - t0)
            return response

        transport.send = counted
        settings = Settings.from_env({**SETTINGS, "StateStorage": connection_string})
        assert settings.state_storage is not None
        service = table_service_client(settings.state_storage, transport=transport)
        for name in (state_table, deadline_table, index_table):
            service.create_table_if_not_exists(name)
        store = TableStore.of(service.get_table_client(state_table), service.get_table_client(deadline_table),
                              service.get_table_client(index_table), transport=transport)
        self.tables = store
        self.table_store = store
        self.runtime = Runtime(store=store, bus=MemoryBus(), config=Config.from_settings(settings),
                               keys=settings.token_keys, instance_id="bench-search")

    def search(self, params: dict[str, str]) -> tuple[Any, dict[str, dict[str, float]]]:
        """One search; (its HttpResult, the requests it sent by ``table|kind``)."""
        from shared.api.search import search_orders

        before = self.counter.snapshot()
        result = search_orders(self.runtime, params)
        return result, _diff(self.counter.snapshot(), before)


def _diff(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for key, v in after.items():
        w = before.get(key, {})
        d = {f: v[f] - w.get(f, 0) for f in ("requests", "entities", "failed")}
        if d["requests"]:
            out[key] = d
    return out


def _params_for(store: CountedStore, params: dict[str, str]) -> dict[str, str]:
    """``page: 2`` means: the token of page 1 (fetched here, not measured)."""
    params = dict(params)
    if params.pop("page", None) == "2":
        first, _ = store.search(params)
        params["continuationToken"] = first.body["continuationToken"]
    return params


def measure_page(store: CountedStore, params: dict[str, str], repeats: int) -> dict[str, Any]:
    """Counts of one search (they are the same every time: checked) and its latency."""
    params = _params_for(store, params)
    result, counts = store.search(params)  # warm-up, and the counts
    assert result.status == 200, result.body

    def again() -> None:
        other, c = store.search(params)
        assert c == counts and other.body["orders"] == result.body["orders"], (c, counts)

    reads = {k: v for k, v in counts.items() if is_read(k)}
    res: dict[str, Any] = {
        "orders_returned": len(result.body["orders"]), "continuation": result.body["continuationToken"] is not None,
        "entities_read": int(sum(v["entities"] for v in reads.values())),
        "index_entities_read": int(sum(v["entities"] for k, v in reads.items() if kind_of(k) == "query")),
        "state_point_reads": int(sum(v["requests"] for k, v in reads.items() if kind_of(k) == "get")),
        "table_requests": int(sum(v["requests"] for v in counts.values())),
        "writes": int(sum(v["requests"] for k, v in counts.items() if k not in reads)),
        "by_kind": {k: {"requests": int(v["requests"]), "entities": int(v["entities"])} for k, v in counts.items()},
        "latency_ms": _latency_ms(again, repeats),
    }
    return res


def _latency_ms(call: Callable[[], Any], repeats: int) -> dict[str, Any]:
    """p50 and max of ``repeats`` calls (ms)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - t0))
    return {"p50": round(statistics.median(times), 2), "max": round(max(times), 2), "n": len(times)}


def seed_stats(store: CountedStore, now: datetime, processes: int = STATS_PROCESSES,
               hours: int = STATS_HOURS) -> dict[str, Any]:
    """Stats rows (``shared.observability.figures``) of ``processes`` processes for every minute and hour
    from ``hours`` before ``now`` to an hour after it, through the app's ``put_stats``."""
    from shared.observability.figures import Figures, hour_stamp, minute_stamp, row_key

    def figures(t: datetime, n: int) -> Figures:
        f = Figures(submitted=n, processed=n, sweeps=4 * n // 3, last_sweep_at=t, last_due_rows=0)
        for k in range(n):
            f.latency.add(0.8 + 0.1 * (k % 13))
        return f

    rows: list[tuple[str, Figures]] = []
    for p in range(processes):
        proc = f"bench-{p}"
        for m in range(-60, hours * 60):
            t = now - timedelta(minutes=m)
            rows.append((row_key("m", minute_stamp(t), proc), figures(t, 3)))
        for h in range(-1, hours):
            t = now - timedelta(hours=h)
            rows.append((row_key("h", hour_stamp(t), proc), figures(t, 180)))
    t0 = time.perf_counter()
    for i in range(0, len(rows), INDEX_BATCH):
        store.table_store.put_stats(dict(rows[i:i + INDEX_BATCH]))
    return {"processes": processes, "hours": hours, "rows": len(rows), "seconds": round(time.perf_counter() - t0, 1)}


def measure_overview(store: CountedStore, repeats: int) -> dict[str, Any]:
    """One overview's table requests and entities read (the queues excluded), and its latency.
    Its two live counts select RowKeys only: ``bench.opcount`` counts entities by their
    PartitionKey, so their keys read are the counts returned, added here."""
    from shared.console.overview import get_overview

    def once() -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
        before = store.counter.snapshot()
        result = get_overview(store.runtime, queue_depths=lambda rt, cap: [])
        assert result.status == 200, result.body
        return result.body, _diff(store.counter.snapshot(), before)

    body, counts = once()
    live_keys = sum(int(v["count"]) for v in body["live"].values())
    stats_entities = int(sum(v["entities"] for v in counts.values()))
    return {"table_requests": int(sum(v["requests"] for v in counts.values())),
            "entities_read": stats_entities + live_keys, "stats_entities_read": stats_entities,
            "live_row_keys_read": live_keys, "live": body["live"],
            # reads are queries and point gets (each remote's breaker row, issue 14)
            "writes": int(sum(v["requests"] for k, v in counts.items() if not is_read(k))),
            "by_kind": {k: {"requests": int(v["requests"]), "entities": int(v["entities"])} for k, v in counts.items()},
            "queues": "excluded: Service Bus peeks, no table request",
            "latency_ms": _latency_ms(once, repeats)}


def measure_size(store: CountedStore, finished: int, now: datetime, repeats: int) -> dict[str, Any]:
    pages = {name: measure_page(store, params, repeats) for name, params in queries(now)}
    worst = max(p["entities_read"] for p in pages.values())
    return {"finished_orders": finished, "page": PAGE, "pages": pages, "max_entities_read": worst,
            "overview": measure_overview(store, repeats),
            "max_table_requests": max(p["table_requests"] for p in pages.values()),
            "within_bound": worst <= bound_entities() and all(p["writes"] == 0 for p in pages.values())}


# ---- report ------------------------------------------------------------------------------------
def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for label, size in result.get("sizes", {}).items():
        lines.append(f"search page of {size['page']} with {size['finished_orders']:,} finished orders ({label}): "
                     f"at most {size['max_entities_read']} entities read, {size['max_table_requests']} requests")
        for name, p in size["pages"].items():
            lines.append(f"  {name:<26} {p['orders_returned']:>3} orders: {p['entities_read']:>3} entities read "
                         f"({p['index_entities_read']} index + {p['state_point_reads']} state point reads), "
                         f"{p['table_requests']} requests, p50 {p['latency_ms']['p50']} ms")
        o = size.get("overview")
        if o:
            lines.append(f"  {'overview (queues excluded)':<26} {o['entities_read']:>7} entities read "
                         f"({o['stats_entities_read']} stats rows + {o['live_row_keys_read']} live row keys), "
                         f"{o['table_requests']} requests, p50 {o['latency_ms']['p50']} ms")
    stats = result.get("stats_seeding")
    if stats:
        lines.append(f"overview stats rows: {stats['processes']} processes, {stats['hours']} h before the run and "
                     f"1 h after ({stats['rows']:,} rows)")
    full = result.get("attention_full_page")
    if full:
        lines.append(f"state=attention with {full['attention_orders']} orders that need an operator "
                     f"({full['finished_orders']:,} finished): {full['orders_returned']} orders, "
                     f"{full['entities_read']} entities read ({full['index_entities_read']} index + "
                     f"{full['state_point_reads']} state point reads), {full['table_requests']} requests, "
                     f"p50 {full['latency_ms']['p50']} ms")
    return lines


def plot(result: dict[str, Any], path: Path) -> str:
    plt = pyplot()
    sizes = list(result["sizes"].values())
    names = list(sizes[0]["pages"])
    width = 0.8 / len(sizes)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=90)
    for k, size in enumerate(sizes):
        xs = [i + k * width for i in range(len(names))]
        label = f"{size['finished_orders']:,} finished"
        ax1.bar(xs, [size["pages"][n]["entities_read"] for n in names], width, label=label)
        ax2.bar(xs, [size["pages"][n]["latency_ms"]["p50"] for n in names], width, label=label)
    full = result.get("attention_full_page")
    if full:
        ax1.bar([len(names)], [full["entities_read"]], width, color="tab:red",
                label=f"attention, {full['attention_orders']} waiting")
        ax2.bar([len(names)], [full["latency_ms"]["p50"]], width, color="tab:red")
    ax1.axhline(bound_entities(), color="k", lw=0.8, ls=":", label=f"bound ({bound_entities()})")
    ax2.set_yscale("log")
    names = [*names, "attention, full page"] if full else names
    for ax, title in ((ax1, f"entities read per page of {PAGE}"), (ax2, "latency p50 (ms, in process, Azurite)")):
        ax.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(names))])
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Search page cost (GET /api/orders)", fontsize=10)
    return save(fig, path)


# ---- the run ---------------------------------------------------------------------------------
def run(sizes: list[int], *, threads: int = 6, repeats: int = 5, api_max: int = API_SEEDING_MAX,
        progress: Progress = print) -> dict[str, Any]:
    """Seed up to each of ``sizes`` finished orders (ascending) and measure the pages at each;
    sizes up to ``api_max`` are seeded through the table API, larger ones bulk-loaded."""
    from local.azurite import start_azurite

    t0 = time.time()
    now = datetime.now(UTC)
    result: dict[str, Any] = {"page": PAGE, "bound_entities": bound_entities(), "search_shards": SEARCH_SHARDS,
                              "live_orders": LIVE_ORDERS,
                              "seeding": [], "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="bench-search-") as location:
        az = start_azurite(location=Path(location), services=("table",))
        store: CountedStore | None = None
        try:
            store = CountedStore(az.connection_string, *TABLES)
            seed_live(az.host, az.table_port, TABLES[0], TABLES[2], now, LIVE_ORDERS)
            result["stats_seeding"] = seed_stats(store, now)
            seeded = 0
            for size in sorted(sizes):
                result["seeding"].append(_seed(az, seeded, size, now, threads, api_max, progress))
                seeded = size
                result["sizes"][str(size)] = measure_size(store, size, now, repeats)
                progress("\n".join(summary_lines({"sizes": {str(size): result["sizes"][str(size)]}})))
                if "attention_full_page" not in result:  # at the smallest size: Azurite's writes are cheap there
                    result["attention_full_page"] = attention_full_page(az, store, size, now, repeats)
        finally:
            az.stop()
    result["seconds"] = round(time.time() - t0, 1)
    return result


def attention_full_page(az: Any, store: CountedStore, finished: int, now: datetime, repeats: int) -> dict[str, Any]:
    """The attention page when more than a page of orders need an operator (then removed)."""
    extra = {"failed": ATTENTION_FULL}
    first = LIVE_ORDERS["failed"]
    ids = seed_live(az.host, az.table_port, TABLES[0], TABLES[2], now, extra, first=first)["failed"]
    try:
        page = measure_page(store, {"state": "attention", "limit": str(PAGE)}, repeats)
    finally:
        tables = store.tables
        keys = [e["RowKey"] for i in range(first, first + ATTENTION_FULL)
                for e in index_entities(*live_order("failed", i, now))]
        for i in range(0, len(keys), INDEX_BATCH):
            tables.write_index([], keys[i:i + INDEX_BATCH])
        for oid in ids:
            for row_key in ("order", "state"):
                tables.state.delete(oid, row_key)
    attention = LIVE_ORDERS["held"] + LIVE_ORDERS["failed"] + ATTENTION_FULL
    return {"finished_orders": finished, "attention_orders": attention, **page}


def _seed(az: Any, seeded: int, size: int, now: datetime, threads: int, api_max: int,
          progress: Progress) -> dict[str, Any]:
    count = size - seeded
    if size <= api_max:
        progress(f"search: seeding {count:,} finished orders' index rows through the table API ({threads} threads)")
        return seed_api(az.host, az.table_port, TABLES[2], seeded, count, now, threads=threads, progress=progress)
    progress(f"search: bulk-loading {count:,} finished orders' index rows (Azurite stopped)")
    return bulk_load(az, TABLES[2], seeded, count, now, progress=progress)
