// Shared by the JetStream / KV / Object Store example scripts: each step's result goes
// into one JSON transcript, normalised so that two servers can be compared byte for byte.
// Made-up values (times, server ids, nonces, client-generated names) are replaced by a tag
// saying they were there, so a missing field still shows up as a difference.

const VOLATILE = new Set([
  "created", "ts", "first_ts", "last_ts", "last_active", "time", "mtime", "nuid",
  "server_id", "leader", "leader_since", "timestampNanos", "timestamp", "nonce",
  "name_generated", "cluster", "api", "domain", "Nats-Time-Stamp",
]);

export function norm(v) {
  if (v === null || v === undefined) return v ?? null;
  if (v instanceof Uint8Array) return new TextDecoder().decode(v);
  if (v instanceof Date) return "<date>";
  if (typeof v === "bigint") return Number(v);
  if (Array.isArray(v)) return v.map(norm);
  if (typeof v === "object") {
    const out = {};
    for (const k of Object.keys(v).sort()) {
      if (typeof v[k] === "function") continue;
      out[k] = VOLATILE.has(k) ? "<volatile>" : norm(v[k]);
    }
    return out;
  }
  return v;
}

export function describeError(e) {
  const out = { error: e?.name ?? "Error", message: String(e?.message ?? e) };
  if (typeof e?.apiError === "function") out.api_error = e.apiError();
  if (typeof e?.code === "number" || typeof e?.code === "string") out.code = e.code;
  return out;
}

export class Transcript {
  constructor() { this.steps = {}; }

  async step(name, fn) {
    try {
      this.steps[name] = norm(await fn());
    } catch (e) {
      this.steps[name] = describeError(e);
    }
  }

  print() { process.stdout.write(JSON.stringify(this.steps) + "\n"); }
}

export function take(iter, n, timeoutMs = 5000) {
  // Reads up to n items from an async iterator, giving up after timeoutMs.
  return takeUntil(iter, (got) => got.length >= n, timeoutMs);
}

export async function takeUntil(iter, done, timeoutMs = 15000) {
  // Reads from an async iterator until done(items read so far) or the time is up. For a
  // watch whose end is known (the last entry says nothing is pending, or the stream holds
  // that many): a fixed window read once came up short on a loaded machine.
  const got = [];
  let handle;
  const timer = new Promise((r) => { handle = setTimeout(() => r("timeout"), timeoutMs); });
  const it = iter[Symbol.asyncIterator]();
  try {
    while (!done(got)) {
      const r = await Promise.race([it.next(), timer]);
      if (r === "timeout" || r.done) break;
      got.push(r.value);
    }
  } finally {
    clearTimeout(handle);
  }
  return got;
}

export async function settle(get, done, timeoutMs = 3000) {
  // Polls get() until done(value) or the time is up; returns the last value either way,
  // so a server that never gets there shows its state in the transcript.
  const end = Date.now() + timeoutMs;
  let v = await get();
  while (!done(v) && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 50));
    v = await get();
  }
  return v;
}
