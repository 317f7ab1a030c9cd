// DAOP for web pages: the explainer's estimateQoS / meetsRequirement / createQoSMonitor, answered by a
// daop-agent on this device over MQTT v5 over WebSockets (docs/web.md).
//
//   const ml = createML({url, deviceId, username, password});    // navigator.ml's part: createContext
//   const context = await ml.createContext({deviceType: 'npu'}); // or: await connect({url, ..., deviceType})
//   const builder = new MLGraphBuilder(context);                 // weightless: constants are descriptors
//   ...
//   const qos = await context.estimateQoS(graph, {inputDescriptors: {input: {shape: [1, 3, 720, 1280]}}});
//   const monitor = context.createQoSMonitor(graph, 'excellent');
//   monitor.onchange = (e) => (e.meetsRequirement ? switchToLocal() : switchToCloud());
//
// The builder, the calls and their report and event shapes are webnn.js's (no dependencies); this module
// carries them over MQTT. Types: daop.d.ts.

import mqtt from 'mqtt';
import { DaopError, QoSContext, randomHex } from './webnn.js';

export {
  DaopError, MLGraph, MLGraphBuilder, MLOperand, OPERATOR_NAMES, OPERATORS, QoSChangeEvent, QoSContext, QoSMonitor, QoSReport,
  TIERS,
} from './webnn.js';

const ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
const STATUS_WAIT_MS = 2000;

function text(payload) {
  return typeof payload === 'string' ? payload : new TextDecoder().decode(payload);
}

/**
 * Connect to the agent of device `deviceId` through its broker's WebSockets listener.
 * `daop-agent web-credentials --json` prints these options.
 * @param {import('./daop.d.ts').ConnectOptions} options
 * @returns {Promise<DaopContext>}
 */
export async function connect({ url, deviceId, username, password, timeoutMs = 30000, owner, ...contextOptions }) {
  if (!ID_RE.test(deviceId ?? '')) throw new TypeError(`deviceId must be 1 to 64 of A-Z a-z 0-9 _ -, not ${deviceId}`);
  if (owner !== undefined && !ID_RE.test(owner)) {
    throw new TypeError(`owner must be 1 to 64 of A-Z a-z 0-9 _ -, not ${owner}`);
  }
  new QoSContext(contextOptions); // a bad deviceType, powerPreference or accelerated: a TypeError, before connecting
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
    const context = new DaopContext(client, deviceId, clientId, timeoutMs, owner, contextOptions);
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
export class DaopContext extends QoSContext {
  #client;
  #pending = new Map(); // correlation -> {resolve, reject, timer}
  #timeoutMs;
  #onPageHide;
  #leaseTimer = renewLeases(this, () => [...this._monitors.keys()]);

  constructor(client, deviceId, clientId, timeoutMs, owner, contextOptions = {}) {
    super(contextOptions);
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
      for (const id of this._monitors.keys()) this.#publish('monitors/delete', { monitor: id }).catch(() => {});
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
      if (match && doc) this._monitorMessage(match[1], doc, packet.retain);
    }
  }

  #setOnline(online) {
    if (online === this.agentOnline) return;
    this.agentOnline = online;
    this.dispatchEvent(new Event('statuschange'));
  }

  _watch(id) {
    return this._subscribe([this._scoped(`monitors/${id}/state`), this._scoped(`monitors/${id}/events`)]);
  }

  /** A monitor of this page's lives while the page renews it (docs/mqtt.md "Leases"). */
  _createFields() {
    return { leaseS: LEASE_S };
  }

  _unwatch(id) {
    this.#client.unsubscribe([this._scoped(`monitors/${id}/state`), this._scoped(`monitors/${id}/events`)]);
  }

  /** Delete this context's monitors on the agent, then disconnect. */
  async close() {
    globalThis.removeEventListener?.('pagehide', this.#onPageHide);
    clearInterval(this.#leaseTimer);
    await Promise.allSettled([...this._monitors.values()].map((m) => m.close()));
    for (const correlation of [...this.#pending.keys()]) {
      this.#settle(correlation, null, new DaopError('closed', 'the connection was closed'));
    }
    await new Promise((resolve) => this.#client.end(false, {}, resolve));
  }
}

/**
 * navigator.ml's part that DAOP needs, answered by the agent behind `connectOptions` (connect()'s): the
 * explainer's `const context = await navigator.ml.createContext({deviceType: 'npu'})` is
 * `await createML(connectOptions).createContext({deviceType: 'npu'})`.
 */
export function createML(connectOptions) {
  return Object.freeze({
    /** @param {{deviceType?: string, powerPreference?: string, accelerated?: boolean}} [options] */
    createContext: (options = {}) => connect({ ...connectOptions, ...options }),
  });
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
