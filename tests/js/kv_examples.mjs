// The Key/Value examples of the nats.js docs (@nats-io/kv README) plus the calls the issue
// names (create/update CAS, delete and purge markers, history, watch with its include modes
// and several filters, keys, TTL), as one session.
// Usage: node kv_examples.mjs nats://127.0.0.1:PORT
// Prints a normalised JSON transcript; the Python test compares nats-server's with Jetraft's.
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm, KvWatchInclude } from "@nats-io/kv";
import { settle, take, takeUntil, Transcript } from "./transcript.mjs";

const t = new Transcript();
const nc = await connect({ servers: process.argv[2] });
const kvm = new Kvm(nc);
const jsm = await jetstreamManager(nc);

const entry = (e) => e === null ? null : {
  bucket: e.bucket, key: e.key, value: e.value ? e.string() : "", revision: e.revision,
  delta: e.delta ?? null, operation: e.operation, length: e.length,
};
const watched = (iter, n, ms = 15000) => take(iter, n, ms).then((es) => es.map(entry));
// A watch of what the bucket holds: until an entry says nothing more is pending (a fixed
// 1.5 s window came up short under load), or 10 entries.
const caughtUp = (iter) => takeUntil(iter, (got) => got.length >= 10 ||
  (got.length > 0 && got[got.length - 1]?.delta === 0)).then((es) => es.map(entry));

await t.step("kvm_create", async () => {
  const kv = await kvm.create("testing", { history: 5 });
  return kv.status().then((s) => ({ bucket: s.bucket, history: s.history, ttl: s.ttl,
    values: s.values, backingStore: s.backingStore, streamInfo: s.streamInfo }));
});
const kv = await kvm.open("testing");
await t.step("create_key", () => kv.create("hello.world", "hi"));
await t.step("create_existing_key", () => kv.create("hello.world", "again"));

// The README's watch: started before the changes, it sees the last value then every update.
const watch = await kv.watch();
let sawFirst;
const first = new Promise((r) => { sawFirst = r; });
const watchAll = takeUntil(watch, (got) => { // (the 5th; 5 s fell short under load)
  if (got.length > 0) sawFirst();
  return got.length >= 5;
}, 30000).then((es) => es.map(entry));
// The last value arrives before the first change: else its pending count (delta) races
// with the put below (a CI run saw nats-server deliver it after the put, delta 1).
await Promise.race([first, new Promise((r) => setTimeout(r, 15000))]);
await t.step("put", () => kv.put("hello.world", "world"));
await t.step("get", async () => entry(await kv.get("hello.world")));
await t.step("get_missing", async () => entry(await kv.get("no.such.key")));
await t.step("update_cas", async () => {
  const e = await kv.get("hello.world");
  return kv.update("hello.world", "cas", e.revision);
});
await t.step("update_wrong_revision", () => kv.update("hello.world", "stale", 1));
await t.step("keys", async () => {
  await kv.put("other.key", "x");
  const buf = [];
  for await (const k of await kv.keys()) buf.push(k);
  return buf.sort();
});
await t.step("keys_filtered", async () => {
  const buf = [];
  for await (const k of await kv.keys("hello.*")) buf.push(k);
  return buf;
});
await t.step("history", async () => {
  const out = [];
  for await (const e of await kv.history({ key: "hello.world" })) out.push(entry(e));
  return out;
});
await t.step("delete", async () => {
  await kv.delete("hello.world");
  return entry(await kv.get("hello.world"));
});
await t.step("create_after_delete", () => kv.create("hello.world", "reborn"));
await t.step("purge", async () => {
  await kv.purge("hello.world");
  const out = [];
  for await (const e of await kv.history({ key: "hello.world" })) out.push(entry(e));
  return out;
});
await t.step("watch_all_from_start", () => watchAll.finally(() => watch.stop()));

await t.step("watch_include_history", async () => {
  const w = await kv.watch({ include: KvWatchInclude.AllHistory });
  return caughtUp(w).finally(() => w.stop());
});
await t.step("watch_updates_only", async () => {
  const w = await kv.watch({ include: KvWatchInclude.UpdatesOnly });
  const got = watched(w, 2);
  await kv.put("other.key", "y");
  await kv.delete("other.key");
  return got.finally(() => w.stop());
});
await t.step("watch_several_filters", async () => {
  await kv.put("a.1", "A1");
  await kv.put("b.1", "B1");
  await kv.put("c.1", "C1");
  const w = await kv.watch({ key: ["a.*", "c.*"] });
  return watched(w, 2).finally(() => w.stop());
});
await t.step("watch_ignore_deletes", async () => {
  const w = await kv.watch({ ignoreDeletes: true });
  return caughtUp(w).finally(() => w.stop());
});
await t.step("status", async () => {
  const s = await kv.status();
  return { values: s.values, history: s.history, size: s.size > 0 };
});
await t.step("kvm_list", async () => {
  const names = [];
  for await (const s of kvm.list()) names.push(s.bucket);
  return names;
});

// Bucket TTL and per-key TTL (markerTTL turns on allow_msg_ttl and delete markers).
await t.step("bucket_ttl", async () => {
  const b = await kvm.create("ttl", { ttl: 1000 });
  await b.put("k", "v");
  const before = entry(await b.get("k"));
  const after = await settle(async () => entry(await b.get("k")), (e) => e === null, 5000);
  return { before, after };
});
await t.step("per_key_ttl", async () => {
  const b = await kvm.create("keyttl", { markerTTL: 1000 });
  const rev = await b.create("k", "v", "1s");
  const before = entry(await b.get("k"));
  const after = await settle(async () => entry(await b.get("k")), (e) => e === null, 6000);
  const stream = await jsm.streams.info("KV_keyttl");
  return { rev, before, after, allow_msg_ttl: stream.config.allow_msg_ttl,
           marker: stream.config.subject_delete_marker_ttl };
});
await t.step("purge_deletes", async () => {
  const r = await kv.purgeDeletes(0);
  return r;
});
await t.step("destroy", async () => [await kv.destroy(), await (await kvm.open("ttl")).destroy(),
  await (await kvm.open("keyttl")).destroy()]);
await t.step("open_destroyed", () => kvm.open("testing"));

t.print();
await nc.close();
