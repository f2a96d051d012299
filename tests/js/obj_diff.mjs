// Object Store calls that obj_examples.mjs leaves out, as nats.js makes them: objects of
// several sizes around the chunk size (empty, one byte, exact multiples, one over), their
// info, digest and the stream they leave; replace with previousRevision (right and wrong),
// headers and metadata, delete twice and of a missing object, links to deleted objects and
// to links, renames onto an existing name, updates of deleted objects, seal twice, status of
// a configured bucket (every getter), watch ignoring deletes, missing buckets, a bucket made
// twice, and the batched ("allowBatched") publishing nats.js can opt into.
// Usage: node obj_diff.mjs nats://127.0.0.1:PORT
// Prints a normalised JSON transcript; tests/integration/test_kv_obj_diff.py compares
// nats-server's with Jetraft's.
import { connect, headers } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { takeUntil, Transcript } from "./transcript.mjs";

const t = new Transcript();
const nc = await connect({ servers: process.argv[2] });
const objm = new Objm(nc);
const jsm = await jetstreamManager(nc);
const enc = new TextEncoder();

const infoView = (i) => i === null ? null : {
  bucket: i.bucket, name: i.name, description: i.description ?? null, size: i.size,
  chunks: i.chunks, digest: i.digest, deleted: i.deleted, revision: i.revision,
  headers: i.headers ? Object.fromEntries([...i.headers.keys()].map((k) => [k, i.headers.get(k)]))
    : null,
  options: i.options ?? null, metadata: i.metadata ?? null,
};
const statusView = (s) => ({
  bucket: s.bucket, description: s.description, ttl: s.ttl, storage: s.storage,
  replicas: s.replicas, sealed: s.sealed, size: s.size, backingStore: s.backingStore,
  metadata: s.metadata, compression: s.compression, streamInfo: s.streamInfo,
});
// Bytes 0..255 repeated: a digest mismatch or a lost chunk shows.
const pattern = (n) => Uint8Array.from({ length: n }, (_, i) => i % 251);
const same = (a, b) => a !== null && a.length === b.length && a.every((v, i) => v === b[i]);
// The bucket's stream: per-subject counts, with the chunk subjects' nuids (made up by the
// client) replaced by their order of appearance.
async function streamView(name) {
  const si = await jsm.streams.info(name, { subjects_filter: ">" });
  const subjects = Object.entries(si.state.subjects ?? {})
    .map(([k, v]) => [k.includes(".C.") ? "chunks" : k, v]).sort();
  const { messages, bytes, first_seq, last_seq, num_deleted, num_subjects } = si.state;
  return { messages, bytes, first_seq, last_seq, num_deleted, num_subjects, subjects };
}

await t.step("create_configured", async () => statusView(await (await objm.create("conf", {
  description: "configured", ttl: 3600 * 1e9, max_bytes: 1 << 22, compression: true,
  metadata: { owner: "tests" } })).status()));
const os = await objm.open("conf");

const K = 128 * 1024;
for (const [name, n, chunk] of [["empty", 0], ["one", 1], ["exact", K], ["two_exact", 2 * K],
  ["over", K + 1], ["small_exact", 12, 4], ["small_over", 13, 4], ["small_under", 3, 4]]) {
  await t.step(`put_${name}`, async () => infoView(await os.putBlob(
    { name, options: chunk ? { max_chunk_size: chunk } : undefined }, pattern(n))));
  await t.step(`get_${name}`, async () => {
    const got = await os.getBlob(name);
    return { length: got?.length ?? null, same: same(got, pattern(n)) };
  });
}
await t.step("stream_after_puts", () => streamView("OBJ_conf"));

await t.step("put_headers_metadata", async () => {
  const h = headers();
  h.set("X-Kind", "test");
  h.append("X-Kind", "second");
  return infoView(await os.putBlob({ name: "with.headers", description: "d", headers: h,
    metadata: { a: "1" } }, enc.encode("hdrs")));
});
await t.step("info_headers_metadata", async () => infoView(await os.info("with.headers")));
await t.step("replace_previous_revision_wrong", async () => infoView(await os.putBlob(
  { name: "one" }, enc.encode("new"), { previousRevision: 1 })));
await t.step("replace_previous_revision_right", async () => {
  const rev = (await os.info("one")).revision;
  return infoView(await os.putBlob({ name: "one" }, enc.encode("new"), { previousRevision: rev }));
});
await t.step("create_previous_revision_0_exists", async () => infoView(await os.putBlob(
  { name: "one" }, enc.encode("again"), { previousRevision: 0 })));
await t.step("create_previous_revision_0_new", async () => infoView(await os.putBlob(
  { name: "fresh" }, enc.encode("f"), { previousRevision: 0 })));
await t.step("stream_after_replace", () => streamView("OBJ_conf"));

await t.step("delete", () => os.delete("over"));
await t.step("delete_again", () => os.delete("over"));
await t.step("delete_missing", () => os.delete("never.was"));
await t.step("info_deleted", async () => infoView(await os.info("over")));
await t.step("get_deleted", () => os.get("over"));
await t.step("update_deleted", () => os.update("over", { description: "x" }));
await t.step("update_missing", () => os.update("never.was", { description: "x" }));
await t.step("rename_onto_existing", () => os.update("one", { name: "exact" }));
await t.step("rename_onto_deleted", async () => {
  await os.update("small_under", { name: "over", description: "renamed" });
  return [infoView(await os.info("over")), infoView(await os.info("small_under"))];
});
await t.step("put_over_deleted", async () => {
  await os.delete("empty");
  return infoView(await os.putBlob({ name: "empty" }, enc.encode("back")));
});
await t.step("link_to_deleted", async () => {
  await os.putBlob({ name: "doomed" }, enc.encode("d"));
  const target = await os.info("doomed");
  await os.delete("doomed");
  return os.link("l.deleted", await os.info("doomed")).then(infoView, (e) => ({
    error: e.message, target: infoView(target) }));
});
await t.step("link_then_target_deleted", async () => {
  await os.putBlob({ name: "target" }, enc.encode("t"));
  const l = await os.link("l.target", await os.info("target"));
  await os.delete("target");
  return { link: infoView(l), get: await os.getBlob("l.target") };
});
await t.step("link_to_link", async () => {
  await os.putBlob({ name: "t2" }, enc.encode("t2"));
  await os.link("l.t2", await os.info("t2"));
  return os.link("l.l.t2", await os.info("l.t2"));
});
await t.step("link_over_existing", () => os.link("exact", { bucket: "conf", name: "t2",
  deleted: false, isLink: () => false }));
await t.step("link_store_get", async () => {
  const other = await objm.create("other");
  await os.linkStore("l.bucket", other);
  return os.get("l.bucket");
});
await t.step("watch_ignore_deletes", async () => {
  const w = await os.watch({ ignoreDeletes: true, includeHistory: true });
  const si = await jsm.streams.info("OBJ_conf", { subjects_filter: "$O.conf.M.>" });
  const live = (await os.list()).length;
  const got = await takeUntil(w, (items) => items.length >= live, 15000);
  w.stop();
  return { metas: si.state.num_subjects, live,
           names: got.map((i) => [i.name, i.deleted, i.isUpdate]).sort() };
});
await t.step("list", async () => (await os.list()).map((i) => [i.name, i.size, i.chunks]).sort());
await t.step("status_before_seal", async () => statusView(await os.status()));
await t.step("seal", async () => statusView(await os.seal()));
await t.step("seal_again", async () => statusView(await os.seal()));
await t.step("delete_sealed", () => os.delete("one"));
await t.step("update_sealed", () => os.update("one", { description: "x" }));

await t.step("create_again", async () => statusView(await (await objm.create("conf", {
  description: "other" })).status()));
await t.step("open_missing", () => objm.open("missing"));
await t.step("open_missing_no_check", async () => (await objm.open("missing", false)).get("x"));
await t.step("create_bad_name", () => objm.create("bad name"));
await t.step("empty_bucket", async () => {
  const e = await objm.create("empty");
  return { list: await e.list(), info: await e.info("x"), get: await e.get("x"),
           status: statusView(await e.status()) };
});
await t.step("objm_list", async () => {
  const out = [];
  for await (const s of objm.list()) out.push([s.bucket, s.sealed, s.size]);
  return out.sort();
});
await t.step("batched_create", async () => statusView(await (await objm.create("batched", {
  allowBatched: true })).status()));
await t.step("batched_put_get", async () => {
  const b = await objm.open("batched", { check: true, allowBatched: true });
  const info = infoView(await b.putBlob({ name: "big", options: { max_chunk_size: 1000 } },
    pattern(5500)));
  return { info, same: same(await b.getBlob("big"), pattern(5500)),
           stream: await streamView("OBJ_batched") };
});
await t.step("destroy", async () => [await os.destroy(), await (await objm.open("other")).destroy()]);
await t.step("destroy_missing", async () => (await objm.open("other", false)).destroy());

t.print();
await nc.close();
