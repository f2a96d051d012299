// The JetStream examples of the nats.js docs (@nats-io/jetstream README: JetStreamManager,
// JetStream client, next / fetch / consume, processing a stream, ordered consumers), run as
// one session. Usage: node js_examples.mjs nats://127.0.0.1:PORT
// Prints a normalised JSON transcript; the Python test compares nats-server's with Jetraft's.
import { connect, Empty } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { settle, Transcript } from "./transcript.mjs";

const t = new Transcript();
const nc = await connect({ servers: process.argv[2] });
const jsm = await jetstreamManager(nc);
const js = jetstream(nc);

const msgView = (m) => ({
  subject: m.subject, seq: m.seq, data: m.string(), redelivered: m.redelivered,
  info: { stream: m.info.stream, consumer: m.info.consumer, deliveryCount: m.info.deliveryCount,
          streamSequence: m.info.streamSequence, deliverySequence: m.info.deliverySequence,
          pending: m.info.pending },
});

// JetStreamManager
await t.step("account_info", () => jsm.getAccountInfo());
await t.step("streams_add", () => jsm.streams.add({ name: "mystream", subjects: ["mystream.*"] }));
await t.step("core_publish_100", async () => {
  for (let i = 0; i < 100; i++) nc.publish("mystream.a", Empty);
  await nc.flush();
  // Core publishes get no ack: wait until the stream holds them (Jetraft stores them
  // through a Raft proposal, so an INFO right after the flush may not see them yet).
  return settle(async () => (await jsm.streams.info("mystream")).state, (s) => s.messages === 100);
});
await t.step("streams_find", () => jsm.streams.find("mystream.A"));
await t.step("streams_find_missing", () => jsm.streams.find("nowhere.at.all"));
await t.step("streams_update", async () => {
  const si = await jsm.streams.info("mystream");
  si.config.subjects.push("a.b");
  return jsm.streams.update("mystream", si.config);
});
await t.step("streams_get_message", async () => {
  const sm = await jsm.streams.getMessage("mystream", { seq: 1 });
  return { seq: sm.seq, subject: sm.subject, data: sm.string() };
});
await t.step("streams_get_last_by_subject", async () => {
  const sm = await jsm.streams.getMessage("mystream", { last_by_subj: "mystream.a" });
  return { seq: sm.seq, subject: sm.subject };
});
await t.step("streams_delete_message", () => jsm.streams.deleteMessage("mystream", 5));
await t.step("streams_delete_message_again", () => jsm.streams.deleteMessage("mystream", 5));
await t.step("state_after_delete", async () => (await jsm.streams.info("mystream")).state);
await t.step("purge_filter_keep", async () => {
  for (let i = 0; i < 10; i++) nc.publish("a.b", Empty);
  await nc.flush();
  await settle(async () => (await jsm.streams.info("mystream")).state, (s) => s.last_seq === 110);
  return jsm.streams.purge("mystream", { filter: "a.b", keep: 5 });
});
await t.step("purge_filter", () => jsm.streams.purge("mystream", { filter: "a.b" }));
await t.step("purge_upto_seq", () => jsm.streams.purge("mystream", { seq: 90 }));
await t.step("purge_all", () => jsm.streams.purge("mystream"));
await t.step("state_after_purge", async () => (await jsm.streams.info("mystream")).state);
await t.step("consumers_add", () =>
  jsm.consumers.add("mystream", { durable_name: "me", ack_policy: AckPolicy.Explicit }));
await t.step("consumers_list", () => jsm.consumers.list("mystream").next());
await t.step("consumers_info", () => jsm.consumers.info("mystream", "me"));
await t.step("consumers_delete", () => jsm.consumers.delete("mystream", "me"));
await t.step("consumers_info_missing", () => jsm.consumers.info("mystream", "me"));
await t.step("streams_list", async () => {
  const all = [];
  for await (const si of jsm.streams.list()) all.push(si.config.name);
  return all;
});
await t.step("streams_names", async () => {
  const all = [];
  for await (const n of jsm.streams.names()) all.push(n);
  return all;
});
await t.step("streams_delete", () => jsm.streams.delete("mystream"));
await t.step("streams_info_missing", () => jsm.streams.info("mystream"));

// JetStream client: publish with acks, dedup and expectations.
await t.step("js_stream_add", () => jsm.streams.add({ name: "a", subjects: ["a.*"] }));
await t.step("js_publish", () => js.publish("a.b"));
await t.step("js_publish_msgid", () => js.publish("a.b", Empty, { msgID: "a" }));
await t.step("js_publish_msgid_duplicate", () => js.publish("a.b", Empty, { msgID: "a" }));
await t.step("js_expect_last_msgid", () => js.publish("a.b", Empty, { expect: { lastMsgID: "a" } }));
await t.step("js_expect_last_msgid_wrong", () =>
  js.publish("a.b", Empty, { expect: { lastMsgID: "zzz" } }));
await t.step("js_expect_last_sequence", () => js.publish("a.b", Empty, { expect: { lastSequence: 3 } }));
await t.step("js_expect_last_sequence_wrong", () =>
  js.publish("a.b", Empty, { expect: { lastSequence: 1 } }));
await t.step("js_expect_stream", () => js.publish("a.b", Empty, { expect: { streamName: "a" } }));
await t.step("js_expect_stream_wrong", () => js.publish("a.b", Empty, { expect: { streamName: "b" } }));
await t.step("js_publish_100_parallel", async () => {
  const acks = await Promise.all(Array.from({ length: 100 }, () => js.publish("a.a", Empty)));
  return acks.map((pa) => pa.seq).sort((x, y) => x - y);
});
await t.step("js_expect_last_subject_sequence", () =>
  js.publish("a.b", Empty, { expect: { lastSubjectSequence: 5 } }));
await t.step("js_expect_last_subject_sequence_wrong", () =>
  js.publish("a.b", Empty, { expect: { lastSubjectSequence: 2 } }));
await t.step("js_publish_no_stream", () => js.publish("nostream.x", Empty, { timeout: 2000 }));

// Consumers: next, fetch, consume, processing a stream.
await t.step("pull_stream_add", async () => {
  const si = await jsm.streams.add({ name: "work", subjects: ["work.*"] });
  for (let i = 0; i < 20; i++) await js.publish(`work.${["x", "y", "z"][i % 3]}`, `m${i}`);
  return si;
});
await t.step("pull_consumer_add", () =>
  jsm.consumers.add("work", { durable_name: "w", ack_policy: AckPolicy.Explicit }));
const c = await js.consumers.get("work", "w");
await t.step("consumer_get_info", () => c.info());
await t.step("next", async () => {
  const m = await c.next();
  m.ack();
  return msgView(m);
});
await t.step("fetch_3_batches", async () => {
  const batches = [];
  for (let i = 0; i < 3; i++) {
    const messages = await c.fetch({ max_messages: 4, expires: 2000 });
    const got = [];
    for await (const m of messages) {
      got.push(msgView(m));
      await m.ackAck();
    }
    batches.push({ got, processed: messages.getProcessed() });
  }
  return batches;
});
await t.step("consume_until_pending_0", async () => {
  const messages = await c.consume();
  const got = [];
  for await (const m of messages) {
    got.push(msgView(m));
    m.ack();
    if (m.info.pending === 0) break;
  }
  return got;
});
await t.step("next_empty", async () => {
  const m = await c.next({ expires: 1000 });
  return m === null ? "no message" : msgView(m);
});
await t.step("nak_then_redeliver", async () => {
  await js.publish("work.x", "again");
  const m = await c.next();
  m.nak();
  const r = await c.next();
  r.term();
  return [msgView(m), msgView(r)];
});
// term() is not acknowledged by the server: wait until it is applied.
await t.step("consumer_info_after", () => settle(() => c.info(), (ci) => ci.num_ack_pending === 0));
await t.step("processing_a_stream", async () => {
  await jsm.consumers.add("work", { durable_name: "freq", ack_policy: AckPolicy.Explicit });
  const pc = await js.consumers.get("work", "freq");
  const messages = await pc.consume();
  const data = {};
  for await (const m of messages) {
    const tok = m.subject.split(".")[1];
    data[tok] = (data[tok] || 0) + 1;
    m.ack();
    if (m.info.pending === 0) break;
  }
  return { data, deleted: await pc.delete() };
});

// Ordered consumers.
await t.step("ordered_fetch", async () => {
  const oc = await js.consumers.get("work");
  const messages = await oc.fetch({ max_messages: 25, expires: 2000 });
  const got = [];
  for await (const m of messages) got.push([m.subject, m.seq, m.info.deliverySequence]);
  return got;
});
// The README writes `filterSubjects`; 3.4.0 reads `filter_subjects` (the other is ignored).
await t.step("ordered_consume_filtered", async () => {
  const oc = await js.consumers.get("work", { filter_subjects: ["work.y"] });
  const messages = await oc.consume();
  const got = [];
  for await (const m of messages) {
    got.push([m.subject, m.seq, m.string()]);
    if (m.info.pending === 0) break;
  }
  return got;
});
await t.step("ordered_next_last_per_subject", async () => {
  const oc = await js.consumers.get("work", { deliver_policy: DeliverPolicy.LastPerSubject });
  const got = [];
  for (let i = 0; i < 3; i++) {
    const m = await oc.next({ expires: 2000 });
    got.push(m ? [m.subject, m.seq] : null);
  }
  return got;
});
await t.step("ordered_consumer_names_gone", async () => {
  // The library's ordered consumers are ephemeral; only the durable "w" stays listed.
  const names = [];
  for await (const n of jsm.consumers.list("work")) if (n.config.durable_name) names.push(n.name);
  return names;
});
// Push consumers (js.consumers.getPushConsumer), pause / resume, direct gets.
await t.step("push_consumer_consume", async () => {
  await jsm.consumers.add("work", { durable_name: "p", deliver_subject: "push.work",
                                    ack_policy: AckPolicy.Explicit, filter_subject: "work.z" });
  const pc = await js.consumers.getPushConsumer("work", "p");
  const messages = await pc.consume();
  const got = [];
  for await (const m of messages) {
    got.push([m.subject, m.seq, m.string(), m.info.pending]);
    m.ack();
    if (m.info.pending === 0) break;
  }
  return got;
});
await t.step("consumer_pause_resume", async () => {
  const until = new Date(Date.now() + 3600_000);
  const paused = await jsm.consumers.pause("work", "w", until);
  const info = await jsm.consumers.info("work", "w");
  const resumed = await jsm.consumers.resume("work", "w");
  return { paused: paused.paused, info_paused: info.paused, resumed: resumed.paused };
});
await t.step("direct_get", async () => {
  await jsm.streams.update("work", { allow_direct: true });
  const sm = await jsm.direct.getMessage("work", { seq: 2 });
  const last = await jsm.direct.getMessage("work", { last_by_subj: "work.x" });
  const next = await jsm.direct.getMessage("work", { next_by_subj: "work.z", seq: 4 });
  return [sm, last, next].map((m) => ({ seq: m.seq, subject: m.subject, data: m.string() }));
});
await t.step("direct_get_batch", async () => {
  const got = [];
  for await (const m of await jsm.direct.getBatch("work", { seq: 5, batch: 3 })) {
    got.push([m.seq, m.subject]);
  }
  return got;
});
await t.step("direct_get_last_for", async () => {
  const got = [];
  for await (const m of await jsm.direct.getLastMessagesFor("work",
    { multi_last: ["work.x", "work.y"] })) got.push([m.seq, m.subject]);
  return got;
});
await t.step("consumer_get_missing", () => js.consumers.get("work", "nobody"));
await t.step("streams_delete_all", async () =>
  [await jsm.streams.delete("a"), await jsm.streams.delete("work")]);
await t.step("account_info_end", async () => {
  const ai = await jsm.getAccountInfo();
  return { streams: ai.streams, consumers: ai.consumers, memory: ai.memory, storage: ai.storage };
});

t.print();
await nc.close();
