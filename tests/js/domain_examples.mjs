// nats.js through a JetStream domain (`jetstream { domain: hub }` on the server): the manager,
// the client, a pull consumer, KV and the Object Store, all with `{ domain: "hub" }`, so every
// API call goes to `$JS.hub.API`. Usage: node domain_examples.mjs nats://127.0.0.1:PORT
// transcript.mjs masks `domain` (volatile in the other scripts): here it is copied under
// `named_domain`, so the comparison sees it.
import { connect } from "@nats-io/transport-node";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { Objm } from "@nats-io/obj";
import { Transcript } from "./transcript.mjs";

const t = new Transcript();
const nc = await connect({ servers: process.argv[2] });
const opts = { domain: "hub" };
const jsm = await jetstreamManager(nc, opts);
const js = jetstream(nc, opts);

await t.step("info_domain", () => ({ named_domain: nc.info?.domain ?? null }));
await t.step("account_info", async () => {
  const ai = await jsm.getAccountInfo();
  return { ...ai, named_domain: ai.domain ?? null };
});
await t.step("streams_add", () => jsm.streams.add({ name: "orders", subjects: ["orders.>"] }));
await t.step("publish", async () => {
  const acks = [];
  for (let i = 0; i < 3; i++) {
    const pa = await js.publish(`orders.${i}`, `o${i}`);
    acks.push({ stream: pa.stream, seq: pa.seq, named_domain: pa.domain ?? null });
  }
  return acks;
});
await t.step("streams_info", async () => {
  const si = await jsm.streams.info("orders");
  return { state: si.state, named_domain: si.domain ?? null };
});
await t.step("consumer_fetch_ack", async () => {
  await jsm.consumers.add("orders", { durable_name: "proc", ack_policy: AckPolicy.Explicit });
  const c = await js.consumers.get("orders", "proc");
  const got = [];
  for await (const m of await c.fetch({ max_messages: 3, expires: 3000 })) {
    got.push([m.subject, m.string(), m.seq, m.info.pending]);
    await m.ackAck();
  }
  return got;
});
await t.step("consumer_info", () => jsm.consumers.info("orders", "proc"));
await t.step("kv", async () => {
  const kv = await new Kvm(js).create("cfg", { history: 3 });
  await kv.put("a", "1");
  const rev = await kv.update("a", "2", 1);
  const e = await kv.get("a");
  const keys = [];
  for await (const k of await kv.keys()) keys.push(k);
  return { rev, value: e?.string(), revision: e?.revision, keys };
});
await t.step("obj", async () => {
  const os = await new Objm(js).create("files");
  await os.putBlob({ name: "a.txt" }, new TextEncoder().encode("hello domain"));
  const data = await os.getBlob("a.txt");
  const names = (await os.list()).map((i) => i.name);
  return { data: new TextDecoder().decode(data), names };
});
await t.step("streams_list", async () => {
  const out = [];
  for await (const si of jsm.streams.list()) {
    out.push({ name: si.config.name, named_domain: si.domain ?? null });
  }
  return out.sort((a, b) => a.name.localeCompare(b.name));
});
await t.step("streams_delete", () => jsm.streams.delete("orders"));

await nc.close();
t.print();
