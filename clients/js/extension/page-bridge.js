// DAOP extension, the page's world: after webnn.js's code (the install command puts both in page.js), the
// explainer's API for every page: `window.daop.ml.createContext()`, and, where the browser has no WebNN,
// `navigator.ml.createContext()` and `MLGraphBuilder` as the explainer writes them. Calls go to content.js by
// window.postMessage; nothing here can name another origin.
const CALL_TIMEOUT_MS = 60000;
const pending = new Map(); // id -> {resolve, reject, timer}
const contexts = new Set();
let nextCall = 1;

function call(method, body) {
  return new Promise((resolve, reject) => {
    const id = `${nextCall++}-${randomHex(4)}`;
    const timer = setTimeout(() => {
      pending.delete(id);
      reject(new DaopError('timeout', `agent not reachable: no answer within ${CALL_TIMEOUT_MS} ms`));
    }, CALL_TIMEOUT_MS);
    pending.set(id, { resolve, reject, timer });
    window.postMessage({ daop: 'call', id, method, body }, '*');
  });
}

window.addEventListener('message', (event) => {
  if (event.source !== window) return;
  const message = event.data;
  if (message?.daop === 'answer') {
    const entry = pending.get(message.id);
    if (!entry) return;
    pending.delete(message.id);
    clearTimeout(entry.timer);
    if (message.status === 'ok') entry.resolve(message.data ?? {});
    else entry.reject(new DaopError(message.error?.code ?? 'bad_answer', message.error?.message ?? 'malformed answer'));
  } else if (message?.daop === 'lost') { // the extension's service worker went: so did the calls in flight
    for (const [id, entry] of pending) {
      pending.delete(id);
      clearTimeout(entry.timer);
      entry.reject(new DaopError('unreachable', 'agent not reachable: the extension lost its connection'));
    }
  } else if (message?.daop === 'event') {
    for (const context of contexts) context._monitorMessage(message.event.monitor, message.event.doc, false);
  }
});

/** A context whose calls the extension carries to the agent, under this page's origin. */
class BridgeContext extends QoSContext {
  constructor(options) {
    super(options);
    contexts.add(this);
  }

  _request(method, body) {
    return call(method, body);
  }

  async _watch() {} // the host follows a monitor's events from before it asks to create it

  _unwatch() {}
}

const ml = Object.freeze({
  /** A context once the agent has answered: a DaopError 'unreachable' says why it cannot. */
  async createContext(options = {}) {
    const context = new BridgeContext(options);
    await call('hello', {});
    return context;
  },
});

Object.defineProperty(window, 'daop', {
  value: Object.freeze({ ml, MLGraphBuilder, MLGraph, MLOperand, QoSReport, QoSChangeEvent, QoSMonitor, DaopError,
    TIERS, OPERATOR_NAMES, OPERATORS }),
});
if (!('ml' in navigator)) { // no WebNN here: the explainer's names are ours
  Object.defineProperty(Navigator.prototype, 'ml', { get: () => ml, configurable: true, enumerable: true });
  if (!('MLGraphBuilder' in window)) window.MLGraphBuilder = MLGraphBuilder;
}
