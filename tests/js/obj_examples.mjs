// The Object Store examples of the nats.js docs (@nats-io/obj README: put from a
// ReadableStream with small chunks, get, watch, list, status, seal, destroy) plus info,
// blobs, metadata update, links and delete, as one session.
// Usage: node obj_examples.mjs nats://127.0.0.1:PORT
// Prints a normalised JSON transcript; the Python test compares nats-server's with Jetraft's.
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { take, takeUntil, Transcript } from "./transcript.mjs";

const t = new Transcript();
const nc = await connect({ servers: process.argv[2] });
const objm = new Objm(nc);
const jsm = await jetstreamManager(nc);
const enc = new TextEncoder();
const dec = new TextDecoder();

function readableStreamFrom(data) {
  return new ReadableStream({
    pull(controller) {
      controller.enqueue(data);
      controller.close();
    },
  });
}

async function chunksOf(rs) {
  const out = [];
  const reader = rs.getReader();
  while (true) {
    const { done, value } = await reader.read();
    if (done) break;
    if (value && value.length) out.push(dec.decode(value));
  }
  return out;
}

const infoView = (i) => i === null ? null : {
  bucket: i.bucket, name: i.name, description: i.description ?? null, size: i.size,
  chunks: i.chunks, digest: i.digest, deleted: i.deleted, revision: i.revision,
  headers: i.headers ? Object.fromEntries([...i.headers.keys()].map((k) => [k, i.headers.get(k)]))
    : null,
  options: i.options ?? null, metadata: i.metadata ?? null,
};

await t.step("objm_create", async () => {
  const os = await objm.create("testing", { storage: "file" });
  const s = await os.status();
  return { bucket: s.bucket, sealed: s.sealed, size: s.size, storage: s.storage,
           streamInfo: s.streamInfo };
});
const os = await objm.open("testing");
await t.step("get_missing", () => os.get("hello"));

const watch = await os.watch();
// (resolves at the 6th update; the bound only matters when one is missing: a loaded machine
// needed more than 5 s for the steps below)
const watchGot = take(watch, 6, 30000);
await t.step("put_stream_1_byte_chunks", async () => infoView(await os.put({
  name: "hello", description: "first entry", options: { max_chunk_size: 1 },
}, readableStreamFrom(enc.encode("hello world")))));
await t.step("get_chunks", async () => {
  const r = await os.get("hello");
  const chunks = await chunksOf(r.data);
  return { info: infoView(r.info), chunks, read_error: await r.error };
});
await t.step("info", async () => infoView(await os.info("hello")));
await t.step("put_blob_replace", async () => {
  const big = enc.encode("x".repeat(300000)); // more than the default 128 KiB chunk
  return infoView(await os.putBlob({ name: "hello", metadata: { k: "v" } }, big));
});
await t.step("get_blob", async () => {
  const b = await os.getBlob("hello");
  return { length: b.length, head: dec.decode(b.slice(0, 4)) };
});
await t.step("put_second", async () => infoView(await os.putBlob({ name: "second" }, enc.encode("2"))));
await t.step("list", async () => (await os.list()).map(infoView).sort((a, b) => a.name < b.name ? -1 : 1));
await t.step("update_meta_rename", async () => {
  await os.update("second", { name: "renamed", description: "moved" });
  return [infoView(await os.info("second")), infoView(await os.info("renamed"))];
});
await t.step("link", async () => {
  const target = await os.info("hello");
  const l = await os.link("hello-link", target);
  const viaLink = await os.getBlob("hello-link");
  return { link: infoView(l), options: l.options, via_link_length: viaLink.length };
});
await t.step("link_store", async () => {
  const other = await objm.create("other");
  const l = await os.linkStore("to-other", other);
  return infoView(l);
});
await t.step("delete", async () => {
  const r = await os.delete("renamed");
  return { purge: r, info: infoView(await os.info("renamed")), get: await os.get("renamed") };
});
await t.step("watch", async () => {
  const got = await watchGot;
  watch.stop();
  return got.map((i) => i === null ? null : { name: i.name, deleted: i.deleted, size: i.size,
                                              chunks: i.chunks, isUpdate: i.isUpdate ?? null });
});
await t.step("watch_include_history", async () => {
  // Until as many entries as the stream holds metadata messages (the server's own count;
  // a fixed 1.5 s window came up short under load).
  const si = await jsm.streams.info("OBJ_testing", { subjects_filter: "$O.testing.M.>" });
  const metas = Object.values(si.state.subjects ?? {}).reduce((a, b) => a + b, 0);
  const w = await os.watch({ includeHistory: true });
  const got = await takeUntil(w, (items) => items.filter((i) => i !== null).length >= metas);
  w.stop();
  return got.map((i) => i === null ? null : [i.name, i.deleted]);
});
await t.step("status", async () => {
  const s = await os.status();
  return { bucket: s.bucket, size: s.size, sealed: s.sealed };
});
await t.step("objm_list", async () => {
  const names = [];
  for await (const s of objm.list()) names.push(s.bucket);
  return names.sort();
});
await t.step("seal", async () => {
  const s = await os.seal();
  return { bucket: s.bucket, sealed: s.sealed };
});
await t.step("put_after_seal", () => os.putBlob({ name: "late" }, enc.encode("no")));
await t.step("streams_behind", async () => {
  const si = await jsm.streams.info("OBJ_testing");
  return { subjects: si.config.subjects, allow_rollup_hdrs: si.config.allow_rollup_hdrs,
           discard: si.config.discard, sealed: si.config.sealed, num_subjects: si.state.num_subjects,
           messages: si.state.messages };
});
await t.step("destroy", async () => [await os.destroy(), await (await objm.open("other")).destroy()]);
await t.step("open_destroyed", () => objm.open("testing"));

t.print();
await nc.close();
