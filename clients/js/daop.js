// DAOP for web pages: the explainer's estimateQoS / meetsRequirement / createQoSMonitor, answered by a
// daop-agent on this device over MQTT v5 over WebSockets (docs/web.md).
//
//   const context = await connect({url, deviceId, username, password});
//   const tier = await context.estimateQoS(webnnText, {inputs: {image: [1, 288, 512, 3]}});
//   const monitor = await context.createQoSMonitor(webnnText, 'excellent', {inputs});
//   monitor.onchange = () => useLocal(monitor.meetsRequirement);
//
// Types: daop.d.ts.

import mqtt from 'mqtt';

/** The tiers, best first (contract: excellent < 16 ms ... poor >= 60 s). */
export const TIERS = Object.freeze(['excellent', 'good', 'fair', 'moderate', 'slow', 'very-slow', 'poor']);

const ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
const STATUS_WAIT_MS = 2000;

/** An error answer of the agent (`code` as in docs/mqtt.md), or `timeout`, `closed`, `not_authorized`, `unreachable`. */
export class DaopError extends Error {
  /** @param {string} code @param {string} message */
  constructor(code, message) {
    super(message);
    this.name = 'DaopError';
    this.code = code;
  }
}

function randomHex(bytes) {
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)), (b) => b.toString(16).padStart(2, '0')).join('');
}

function base64(bytes) {
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

/** The request's model field: `.webnn` text, a webnn-graph-json object, or ONNX bytes. */
function modelFields(graph) {
  if (typeof graph === 'string') return { webnn: graph };
  if (graph instanceof ArrayBuffer) return { onnx: base64(new Uint8Array(graph)) };
  if (ArrayBuffer.isView(graph)) return { onnx: base64(new Uint8Array(graph.buffer, graph.byteOffset, graph.byteLength)) };
  if (graph !== null && typeof graph === 'object') return { graph };
  throw new TypeError('a graph is .webnn text, a webnn-graph-json object, or ONNX bytes');
}

/** `{name: [1, 3, 224, 224]}` or `{name: {shape, dataType}}` -> the request's `inputs`. */
function inputFields(inputs) {
  if (inputs === undefined) return {};
  const out = {};
  for (const [name, spec] of Object.entries(inputs)) out[name] = Array.isArray(spec) ? { shape: spec } : spec;
  return { inputs: out };
}

function text(payload) {
  return typeof payload === 'string' ? payload : new TextDecoder().decode(payload);
}

/**
 * Connect to the agent of device `deviceId` through its broker's WebSockets listener.
 * `daop-agent web-credentials --json` prints these options.
 * @param {import('./daop.d.ts').ConnectOptions} options
 * @returns {Promise<DaopContext>}
 */
export async function connect({ url, deviceId, username, password, timeoutMs = 30000, owner }) {
  if (!ID_RE.test(deviceId ?? '')) throw new TypeError(`deviceId must be 1 to 64 of A-Z a-z 0-9 _ -, not ${deviceId}`);
  if (owner !== undefined && !ID_RE.test(owner)) {
    throw new TypeError(`owner must be 1 to 64 of A-Z a-z 0-9 _ -, not ${owner}`);
  }
  const clientId = `daop-web-${randomHex(8)}`;
  const client = mqtt.connect(url, {
    protocolVersion: 5, clientId, username, password, clean: true, reconnectPeriod: 1000,
    connectTimeout: timeoutMs, resubscribe: true,
  });
  try {
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new DaopError('timeout', `no answer from ${url} within ${timeoutMs} ms`)),
        timeoutMs);
      const done = (fn, value) => { clearTimeout(timer); client.off('connect', onConnect); client.off('error', onError);
        client.off('close', onClose); fn(value); };
      const onConnect = () => done(resolve);
      const onError = (err) => done(reject, [4, 5, 134, 135].includes(err.code)
        ? new DaopError('not_authorized', `${url} refused ${username ?? 'anonymous'}: wrong username or password`)
        : new DaopError('unreachable', `cannot reach ${url}: ${err.message}`));
      const onClose = () => done(reject, new DaopError('unreachable', `cannot reach ${url}`));
      client.on('connect', onConnect);
      client.on('error', onError);
      client.on('close', onClose);
    });
    const context = new DaopContext(client, deviceId, clientId, timeoutMs, owner);
    let timer;
    const status = new Promise((resolve) => {
      context.addEventListener('statuschange', resolve, { once: true });
      timer = setTimeout(resolve, Math.min(timeoutMs, STATUS_WAIT_MS)); // no agent ever ran with this id here
    });
    await context._subscribe([context._responseTopic, context._topic('status')]);
    await status; // the retained status follows the subscription: agentOnline is known when connect() resolves
    clearTimeout(timer);
    return context;
  } catch (err) {
    client.end(true);
    throw err;
  }
}

/**
 * One connection to an agent. `agentOnline` is false while the agent is stopped or dead (its status, its Will)
 * or its broker cannot be reached (the connection is retried every second); a `statuschange` event says when
 * it changes.
 */
export class DaopContext extends EventTarget {
  #client;
  #pending = new Map(); // correlation -> {resolve, reject, timer}
  #monitors = new Map(); // id -> QoSMonitor
  #timeoutMs;
  #onPageHide;
  #leaseTimer = renewLeases(this, () => [...this.#monitors.keys()]);

  constructor(client, deviceId, clientId, timeoutMs, owner) {
    super();
    this.#client = client;
    this.deviceId = deviceId;
    /** The client scope asked under (docs/mqtt.md "Owners"); undefined: the shared, unscoped topics. */
    this.owner = owner;
    this.#timeoutMs = timeoutMs;
    this._responseTopic = this._scoped(`response/client/${clientId}`);
    /** @type {boolean | null} null until the agent's retained status arrives */
    this.agentOnline = null;
    client.on('message', (topic, payload, packet) => this.#message(topic, payload, packet));
    client.on('close', () => this.#setOnline(false)); // the broker is gone: so is the agent, as far as we know
    client.on('error', () => {}); // a failed reconnect: 'close' said it, and the client retries every second
    this.#onPageHide = () => {
      for (const id of this.#monitors.keys()) this.#publish('monitors/delete', { monitor: id }).catch(() => {});
      client.stream?.uncork?.(); // mqtt.js sends on a later tick, which a page being unloaded never reaches
    };
    globalThis.addEventListener?.('pagehide', this.#onPageHide); // a closed tab leaves no monitor behind
  }

  _topic(suffix) {
    return `daop/${this.deviceId}/${suffix}`;
  }

  /** A topic in this client's scope: its requests, answers and monitors (its owner's, when it has one). */
  _scoped(suffix) {
    return this.owner ? this._topic(`client/${this.owner}/${suffix}`) : this._topic(suffix);
  }

  _subscribe(topics) {
    return new Promise((resolve, reject) => this.#client.subscribe(topics, { qos: 1 }, (err, granted) => {
      const refused = (granted ?? []).find((g) => g.qos >= 128);
      if (err || refused) reject(new DaopError('not_authorized', `cannot subscribe to ${refused?.topic ?? topics}: ${err?.message ?? 'refused'}`));
      else resolve();
    }));
  }

  #publish(method, body, properties = {}) {
    return new Promise((resolve, reject) => this.#client.publish(this._scoped(`request/${method}`), JSON.stringify(body),
      { qos: 1, properties }, (err) => (err ? reject(new DaopError('closed', err.message)) : resolve())));
  }

  /** One request; resolves with the answer's `data`, rejects with a DaopError. */
  _request(method, body) {
    const correlation = randomHex(16);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(correlation);
        reject(new DaopError('timeout', `no answer from the agent of ${this.deviceId} within ${this.#timeoutMs} ms`));
      }, this.#timeoutMs);
      this.#pending.set(correlation, { resolve, reject, timer });
      this.#publish(method, { ...body, transaction: correlation },
        { responseTopic: this._responseTopic, correlationData: correlation })
        .catch((err) => this.#settle(correlation, null, err));
    });
  }

  #settle(correlation, answer, err) {
    const entry = this.#pending.get(correlation);
    if (!entry) return;
    this.#pending.delete(correlation);
    clearTimeout(entry.timer);
    if (err) entry.reject(err);
    else if (answer?.status === 'ok') entry.resolve(answer.data);
    else entry.reject(new DaopError(answer?.error?.code ?? 'bad_answer', answer?.error?.message ?? 'malformed answer'));
  }

  #message(topic, payload, packet) {
    let doc;
    try {
      doc = payload.length ? JSON.parse(text(payload)) : null;
    } catch {
      return; // not ours to judge; an answer that cannot be read times out
    }
    if (topic === this._responseTopic) {
      const correlation = packet.properties?.correlationData;
      this.#settle(correlation ? text(correlation) : doc?.transaction, doc, null);
    } else if (topic === this._topic('status')) {
      this.#setOnline(doc?.state === 'online');
    } else {
      const match = /\/monitors\/([^/]+)\/(state|events)$/.exec(topic);
      const monitor = match && this.#monitors.get(match[1]);
      if (monitor && doc) monitor._message(doc, packet.retain);
    }
  }

  #setOnline(online) {
    if (online === this.agentOnline) return;
    this.agentOnline = online;
    this.dispatchEvent(new Event('statuschange'));
  }

  /**
   * The tier of one inference of `graph` on this device, now.
   * @param {import('./daop.d.ts').Graph} graph
   * @param {import('./daop.d.ts').RequestOptions} [options]
   * @returns {Promise<import('./daop.d.ts').Tier>}
   */
  async estimateQoS(graph, { inputs } = {}) {
    return (await this._request('estimate', { ...modelFields(graph), ...inputFields(inputs) })).performanceTier;
  }

  /**
   * Whether `graph` runs within `tier` (or better) on this device, now.
   * @param {import('./daop.d.ts').Graph} graph
   * @param {import('./daop.d.ts').Tier} tier
   * @param {import('./daop.d.ts').RequestOptions} [options]
   * @returns {Promise<boolean>}
   */
  async meetsRequirement(graph, tier, { inputs } = {}) {
    const body = { ...modelFields(graph), ...inputFields(inputs), requiredTier: tier };
    return (await this._request('meets', body)).meetsRequirement;
  }

  /**
   * A monitor the agent keeps true to the device: `meetsRequirement`, and a `change` event when it changes.
   * @param {import('./daop.d.ts').Graph} graph
   * @param {import('./daop.d.ts').Tier} tier
   * @param {import('./daop.d.ts').MonitorOptions} [options]
   * @returns {Promise<QoSMonitor>}
   */
  async createQoSMonitor(graph, tier, { inputs, monitor: id = randomHex(8) } = {}) {
    const body = { ...modelFields(graph), ...inputFields(inputs), requiredTier: tier, monitor: id, leaseS: LEASE_S };
    if (this.#monitors.has(id)) throw new DaopError('bad_monitor_id', `monitor ${id} is already open here`);
    const monitor = new QoSMonitor(this, id, tier);
    this.#monitors.set(id, monitor);
    try {
      // Subscribe first, so that no change between the answer and the subscription is missed.
      await this._subscribe([this._scoped(`monitors/${id}/state`), this._scoped(`monitors/${id}/events`)]);
      monitor._created((await this._request('monitors/create', body)).meetsRequirement);
    } catch (err) {
      this._forget(id);
      throw err;
    }
    return monitor;
  }

  _forget(id) {
    if (this.#monitors.delete(id)) {
      this.#client.unsubscribe([this._scoped(`monitors/${id}/state`), this._scoped(`monitors/${id}/events`)]);
    }
  }

  /** Delete this context's monitors on the agent, then disconnect. */
  async close() {
    globalThis.removeEventListener?.('pagehide', this.#onPageHide);
    clearInterval(this.#leaseTimer);
    await Promise.allSettled([...this.#monitors.values()].map((m) => m.close()));
    for (const correlation of [...this.#pending.keys()]) {
      this.#settle(correlation, null, new DaopError('closed', 'the connection was closed'));
    }
    await new Promise((resolve) => this.#client.end(false, {}, resolve));
  }
}

/**
 * A monitor registered with the agent. `meetsRequirement` is always the latest value; `change` events
 * (and `onchange`) fire when it changes, with `event.detail = {meetsRequirement, seq, ts}`.
 */
export class QoSMonitor extends EventTarget {
  #context;
  #seq = -1;
  #answered = false;
  #closed = false;

  constructor(context, id, tier) {
    super();
    this.#context = context;
    this.id = id;
    this.requiredTier = tier;
    /** @type {boolean} */
    this.meetsRequirement = false;
    /** @type {((event: CustomEvent) => void) | null} */
    this.onchange = null;
    this.addEventListener('change', (event) => this.onchange?.call(this, event));
  }

  _created(meets) {
    this.#answered = true;
    if (this.#seq < 0) this.meetsRequirement = meets; // else a live state or event already told a newer value
  }

  _message(doc, retained) {
    // Before the create answer, a retained state is a previous monitor's with this id: not ours yet.
    if (this.#closed || (!this.#answered && retained) || typeof doc.meetsRequirement !== 'boolean') return;
    if (typeof doc.seq !== 'number' || doc.seq <= this.#seq) return; // QoS 1 duplicates, state after event
    this.#seq = doc.seq;
    if (doc.meetsRequirement === this.meetsRequirement) return;
    this.meetsRequirement = doc.meetsRequirement;
    if (this.#answered) {
      this.dispatchEvent(new CustomEvent('change', { detail: { meetsRequirement: doc.meetsRequirement, seq: doc.seq, ts: doc.ts ?? null } }));
    }
  }

  /** Delete the monitor on the agent; no more events. */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#context._forget(this.id);
    try {
      await this.#context._request('monitors/delete', { monitor: this.id });
    } catch (err) {
      if (err.code !== 'unknown_monitor') throw err; // already gone is what close() wants
    }
  }
}

/** A monitor lives while its page runs: created with this lease, renewed every third of it (docs/mqtt.md "Leases"). */
const LEASE_S = 60;

/** Renew the context's monitors (`ids()`) every third of their lease; the timer, for clearInterval on close. */
function renewLeases(context, ids) {
  const timer = setInterval(() => {
    const monitors = ids();
    if (monitors.length) context._request('monitors/renew', { monitors }).catch(() => {}); // next third: again
  }, (LEASE_S * 1000) / 3);
  timer.unref?.(); // (Node) a context left open does not hold the process
  return timer;
}
