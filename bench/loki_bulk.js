// Bulk-load entities into one table of a STOPPED Azurite's table database (LokiJS, the file
// `__azurite_db_table__.json` of its --location), for bench/search_seed.py.
//
// Why: Azurite 3.35 checks every insert with findOne({PartitionKey, RowKey}), which LokiJS
// answers from its PartitionKey index and then scans the whole partition for the RowKey; the
// search index is ONE partition, so inserting N rows through the API costs O(N^2) (measured
// with Azurite's own LokiJS: 0.8 ms per insert up to 10k rows, 8 ms from 10k to 50k rows).
// Here rows are inserted without that check (their keys are new: random order ids) and the
// binary indices are rebuilt once, then the file is saved for Azurite to load at its restart.
//
// usage: node bench/loki_bulk.js DB_FILE COLLECTION < entities.jsonl
//   COLLECTION is `${account}$${table}`; each line is an entity as sent to the table API
//   (PartitionKey, RowKey, properties, `@odata.type` annotations). Prints {"inserted": N}.
"use strict";
const path = require("path");
const readline = require("readline");
const Loki = require(path.join(__dirname, "..", "node_modules", "lokijs"));

const [dbPath, collectionName] = process.argv.slice(2);
if (!dbPath || !collectionName) {
  console.error("usage: node loki_bulk.js DB_FILE COLLECTION < entities.jsonl");
  process.exit(2);
}
const db = new Loki(dbPath, { adapter: new Loki.LokiFsAdapter() });
db.loadDatabase({}, (err) => {
  if (err) throw err;
  const coll = db.getCollection(collectionName);
  if (!coll) {
    console.error(`no collection ${collectionName} in ${dbPath}`);
    process.exit(3);
  }
  coll.adaptiveBinaryIndices = false; // one index rebuild at the end, not a splice per row
  // Azurite's own formats: 7 fractional digits, and the ETag derived from the time
  const modified = new Date().toISOString().replace("Z", "0000Z");
  const etag = `W/"datetime'${encodeURIComponent(modified)}'"`;
  let inserted = 0;
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  lines.on("line", (line) => {
    if (!line) return;
    const e = JSON.parse(line);
    coll.insert({
      PartitionKey: e.PartitionKey,
      RowKey: e.RowKey,
      properties: { ...e, Timestamp: modified, "Timestamp@odata.type": "Edm.DateTime" },
      lastModifiedTime: modified,
      eTag: etag,
    });
    inserted += 1;
  });
  lines.on("close", () => {
    coll.ensureAllIndexes(true);
    coll.adaptiveBinaryIndices = true; // as Azurite creates its collections
    db.saveDatabase((saveErr) => {
      if (saveErr) throw saveErr;
      console.log(JSON.stringify({ inserted }));
    });
  });
});
