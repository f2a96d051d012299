// One scripted core-NATS session with the official nats.js client.
// Usage: node core_session.mjs nats://127.0.0.1:PORT
// Prints a JSON transcript of what the client saw; the Python test runs it against
// nats-server and jetraft and requires the two transcripts to be equal.
import { connect, headers } from "@nats-io/transport-node";

const enc = new TextEncoder();
const dec = new TextDecoder();
const out = {};

async function collect(sub, n) {
  const got = [];
  for await (const m of sub) {
    got.push([m.subject, dec.decode(m.data), m.headers ? m.headers.get("K") : null]);
    if (got.length === n) break;
  }
  return got;
}

async function wildcards(nc) {
  const star = nc.subscribe("js.*", { max: 2 });
  const gt = nc.subscribe("js.>", { max: 3 });
  const starGot = collect(star, 2);
  const gtGot = collect(gt, 3);
  const h = headers();
  h.set("K", "v1");
  nc.publish("js.a", enc.encode("one"));
  nc.publish("js.a.b", enc.encode("two"), { headers: h });
  nc.publish("js.c", enc.encode("three"));
  out.star = await starGot;
  out.gt = await gtGot;
}

async function queueGroup(nc) {
  const counts = [0, 0];
  const subs = [0, 1].map((i) =>
    nc.subscribe("work", { queue: "q", callback: () => { counts[i] += 1; } }));
  await nc.flush();
  for (let i = 0; i < 50; i++) nc.publish("work", enc.encode(String(i)));
  await nc.flush();
  await new Promise((r) => setTimeout(r, 300));
  out.queue_total = counts[0] + counts[1];
  subs.forEach((s) => s.unsubscribe());
}

async function requestReply(nc) {
  nc.subscribe("svc", { callback: (_err, m) => m.respond(enc.encode(dec.decode(m.data).toUpperCase())) });
  await nc.flush();
  const r = await nc.request("svc", enc.encode("ping"), { timeout: 5000 });
  out.reply = dec.decode(r.data);
  try {
    await nc.request("nobody.home", enc.encode("x"), { timeout: 5000 });
    out.no_responders = "answered";
  } catch (err) {
    out.no_responders = err.constructor.name + ":" + (err.code ?? err.message);
  }
}

async function maxPayload(nc) {
  out.max_payload = nc.info.max_payload;
  try {
    nc.publish("big", new Uint8Array(nc.info.max_payload + 1));
    out.oversized = "sent";
  } catch (err) {
    out.oversized = err.constructor.name;
  }
}

const nc = await connect({ servers: process.argv[2], reconnect: false });
await wildcards(nc);
await queueGroup(nc);
await requestReply(nc);
await maxPayload(nc);
out.headers_supported = nc.info.headers;
await nc.drain();
out.closed = (await nc.closed()) ?? "clean";
process.stdout.write(JSON.stringify(out) + "\n");
