// Key/Value calls that kv_examples.mjs leaves out, as nats.js makes them: bucket options
// (description, limits, compression, metadata, republish), CAS on put/delete/purge with
// `previousSeq`, create over a delete and over a purge, get by revision, history and keys
// over several filters, watch from a revision and headers only, wildcard delete, the errors
// of full buckets and too-big values, purge markers with a TTL, purgeDeletes, mirrored and
// sourced buckets, and the errors for buckets that are missing or made twice.
// Usage: node kv_diff.mjs nats://127.0.0.1:PORT
// Prints a normalised JSON transcript; tests/integration/test_kv_obj_diff.py compares
// nats-server's with Jetraft's.
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm, KvWatchInclude } from "@nats-io/kv";
import { settle, takeUntil, Transcript } from "./transcript.mjs";

const t = new Transcript();
const nc = await connect({ servers: process.argv[2] });
const kvm = new Kvm(nc);
const jsm = await jetstreamManager(nc);

const entry = (e) => e === null ? null : {
  key: e.key, value: e.value ? e.string() : "", revision: e.revision,
  delta: e.delta ?? null, operation: e.operation, length: e.length,
};
// Every KvStatus getter (they live on the prototype, so the transcript would skip them).
const statusView = (s) => ({
  bucket: s.bucket, values: s.values, history: s.history, ttl: s.ttl, markerTTL: s.markerTTL,
  backingStore: s.backingStore, replicas: s.replicas, description: s.description,
  maxBucketSize: s.maxBucketSize, maxValueSize: s.maxValueSize, placement: s.placement,
  republish: s.republish, size: s.size, metadata: s.metadata, compression: s.compression,
  streamInfo: s.streamInfo,
});
const all = async (iter) => {
  const out = [];
  for await (const v of iter) out.push(v);
  return out;
};
const historyOf = async (kv, key) => (await all(await kv.history({ key }))).map(entry);
const keysOf = async (kv, filter) => (await all(await kv.keys(filter))).sort();
// A watch of what the bucket holds: until an entry says nothing more is pending.
const caughtUp = (w) => takeUntil(w, (got) => got.length >= 20 ||
  (got.length > 0 && got[got.length - 1]?.delta === 0)).then((es) => es.map(entry));

await t.step("create_configured", async () => statusView(await (await kvm.create("cfg", {
  description: "configured", history: 3, maxValueSize: 100, max_bytes: 2000,
  compression: true, metadata: { owner: "tests" },
  republish: { src: ">", dest: "repub.>", headers_only: true },
})).status()));
const kv = await kvm.open("cfg");
const repub = nc.subscribe("repub.>", { max: 3 });
const repubSeen = all(repub).then((ms) => ms.map((m) => ({
  subject: m.subject, data: m.string(),
  headers: Object.fromEntries([...m.headers.keys()].map((k) => [k, m.headers.get(k)])),
})));

await t.step("put_previous_seq_0", () => kv.put("a", "1", { previousSeq: 0 }));
await t.step("put_previous_seq_0_again", () => kv.put("a", "2", { previousSeq: 0 }));
await t.step("put_previous_seq_right", () => kv.put("a", "2", { previousSeq: 1 }));
await t.step("update_version_0", () => kv.update("a", "x", 0));
await t.step("delete_previous_seq_wrong", () => kv.delete("a", { previousSeq: 1 }));
await t.step("purge_previous_seq_wrong", () => kv.purge("a", { previousSeq: 7 }));
await t.step("delete_previous_seq_right", () => kv.delete("a", { previousSeq: 2 }));
await t.step("republished", () => repubSeen);
await t.step("create_over_delete", () => kv.create("a", "3"));
await t.step("purge", () => kv.purge("a"));
await t.step("create_over_purge", () => kv.create("a", "4"));
await t.step("history_after_purge", () => historyOf(kv, "a"));
await t.step("get_revision_of_a_delete", async () => entry(await kv.get("a", { revision: 3 })));
await t.step("get_revision_of_other_key", async () => {
  const rev = await kv.put("b", "other");
  return entry(await kv.get("a", { revision: rev }));
});
await t.step("get_revision_beyond", async () => entry(await kv.get("a", { revision: 999 })));

await t.step("value_at_max_size", () => kv.put("big", "x".repeat(100)));
await t.step("value_over_max_size", () => kv.put("big", "x".repeat(101)));
await t.step("fill_to_max_bytes", async () => {
  for (let i = 0; i < 100; i++) {
    try {
      await kv.put(`fill.${i}`, "y".repeat(90));
    } catch (e) {
      return { stored: i, error: e.message, code: e.code ?? null };
    }
  }
  return { stored: 100 };
});
await t.step("status_full", async () => statusView(await kv.status()));
await t.step("invalid_keys", async () => {
  const out = {};
  for (const k of ["", ".a", "a.", "a b", "a*", "$x"]) {
    try {
      out[k] = await kv.put(k, "v");
    } catch (e) {
      out[k] = e.message;
    }
  }
  return out;
});

await t.step("hist_bucket", async () => statusView(await (await kvm.create("hist", {
  history: 5, compression: false })).status()));
const h = await kvm.open("hist");
for (const [k, v] of [["x.1", "1"], ["x.2", "2"], ["y.1", "3"], ["x.1", "4"], ["z", "5"],
  ["y.1", "6"]]) {
  await h.put(k, v);
}
await h.delete("x.2");
await h.purge("y.1");
await t.step("history_several_keys", async () => (await all(await h.history({
  key: ["x.1", "y.*"] }))).map(entry));
await t.step("history_missing_key", () => historyOf(h, "nope"));
await t.step("keys_several_filters", () => keysOf(h, ["x.*", "z"]));
await t.step("keys_no_match", () => keysOf(h, "q.*"));
await t.step("watch_resume_from_revision", async () => {
  const w = await h.watch({ resumeFromRevision: 4 });
  return caughtUp(w).finally(() => w.stop());
});
await t.step("watch_headers_only", async () => {
  const w = await h.watch({ headers_only: true });
  return caughtUp(w).finally(() => w.stop());
});
await t.step("watch_history_ignore_deletes", async () => {
  const w = await h.watch({ include: KvWatchInclude.AllHistory, ignoreDeletes: true });
  return caughtUp(w).finally(() => w.stop());
});
await t.step("delete_wildcard", async () => {
  await h.delete("x.*");
  return [await historyOf(h, "x.1"), await keysOf(h)];
});
await t.step("purge_deletes_keep_recent", async () => [await h.purgeDeletes(),
  await historyOf(h, ">")]);
await t.step("purge_deletes_all", async () => [await h.purgeDeletes(-1),
  await historyOf(h, ">")]);

await t.step("purge_with_ttl", async () => {
  const b = await kvm.create("marks", { markerTTL: 1000, history: 2 });
  await b.put("k", "v");
  await b.put("gone", "v");
  await b.purge("k", { ttl: "1s" });
  await b.delete("gone");
  const before = await historyOf(b, ">");
  // The purge marker goes after its TTL and leaves nothing behind (no MaxAge marker).
  const after = await settle(() => historyOf(b, ">"),
    (es) => !es.some((e) => e.key === "k"), 6000);
  const { messages, first_seq, last_seq, num_deleted } = (await jsm.streams.info("KV_marks")).state;
  return { before, after, state: { messages, first_seq, last_seq, num_deleted } };
});
await t.step("max_age_markers", async () => {
  const b = await kvm.create("aged", { markerTTL: 1000, ttl: 1000 });
  await b.put("v", "1");
  await b.put("p", "1");
  await b.purge("p");
  const w = await b.watch({ include: KvWatchInclude.UpdatesOnly });
  // v and p go by max_age after 1 s: v leaves a MaxAge marker (which goes 1 s later, leaving
  // none), the purge of p leaves none. So one entry, whatever the time waited past 3.5 s.
  const got = await takeUntil(w, () => false, 3500);
  w.stop();
  return got.map((e) => ({ key: e.key, operation: e.operation, revision: e.revision,
                           isUpdate: e.isUpdate }));
});
await t.step("mirror_bucket", async () => {
  const m = await kvm.create("mir", { mirror: { name: "hist" } });
  const want = (await jsm.streams.info("KV_hist")).state.messages;
  const si = await settle(() => jsm.streams.info("KV_mir"),
    (i) => i.state.messages >= want, 8000);
  return { config: si.config, state: si.state, z: entry(await m.get("z")), keys: await keysOf(m) };
});
await t.step("mirror_put_refused", async () => {
  const m = await kvm.open("mir");
  return m.put("new", "v");
});
await t.step("sourced_bucket", async () => {
  // An origin written now: the copy drops the Nats-Expected-* header of the create over a
  // delete. One source only: with a second one (another bucket) nats-server 2.15.1 did
  // not copy that one's messages in this session, though it does elsewhere (not explained;
  // docs/notes/kvdiff14.md).
  const o = await kvm.create("orig", { history: 3 });
  await o.put("k", "1");
  await o.delete("k");
  await o.create("k", "2");
  await o.put("j", "3");
  const s = await kvm.create("agg", { sources: [{ name: "orig" }] });
  // One value per key (history 1): as many as the origin has keys.
  const si = await settle(() => jsm.streams.info("KV_agg", { subjects_filter: ">" }),
    (i) => i.state.num_subjects >= 2, 8000);
  const sm = await jsm.streams.getMessage("KV_agg", { last_by_subj: "$KV.agg.k" });
  return { config: si.config, subjects: si.state.subjects, keys: await keysOf(s),
           k: entry(await s.get("k")), k_headers: [...sm.header.keys()].sort() };
});

await t.step("create_again_same", async () => statusView(await (await kvm.create("hist", {
  history: 5, compression: false })).status()));
await t.step("create_again_different", async () => statusView(await (await kvm.create("hist", {
  history: 2 })).status()));
await t.step("open_missing", () => kvm.open("missing").then((b) => b.status()));
await t.step("create_bad_name", () => kvm.create("bad name"));
await t.step("kvm_list", async () => (await all(kvm.list())).map((s) => s.bucket).sort());
await t.step("destroy_then_put", async () => {
  const b = await kvm.create("short");
  await b.destroy();
  return b.put("k", "v");
});

t.print();
await nc.close();
