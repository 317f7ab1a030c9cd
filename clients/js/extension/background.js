// DAOP extension, service worker: one native messaging port to the daop-agent host (`daop-agent web-bridge
// host`, registered by `daop-agent web-bridge install`), shared by every page. Each call is tagged with the
// origin the browser gives for the page's frame: the host asks the agent under that origin's own owner scope,
// so that each origin has its own monitors, privacy jitter and request budget; a monitor's events go back
// only to the page that created it.
const HOST = 'org.daop.agent';
let native = null;
let nextId = 1;
const calls = new Map(); // host call id -> {port, pageId}
const monitors = new Map(); // `${origin}\n${monitor}` -> the page's port

function unreachable(why) {
  return { code: 'unreachable', message: `agent not reachable: ${why}` };
}

function nativePort() {
  if (native) return native;
  native = chrome.runtime.connectNative(HOST);
  native.onMessage.addListener(fromHost);
  native.onDisconnect.addListener(() => {
    const why = chrome.runtime.lastError?.message ?? 'the native messaging host exited';
    native = null;
    const error = unreachable(`${why} (is the host installed? daop-agent web-bridge install; docs/web.md)`);
    for (const { port, pageId } of calls.values()) port.postMessage({ id: pageId, status: 'error', error });
    calls.clear();
    monitors.clear(); // the host deleted them when it went
  });
  return native;
}

function toHost(origin, method, body, reply) {
  const id = nextId++;
  if (reply) calls.set(id, reply);
  try {
    nativePort().postMessage({ id, origin, method, body });
  } catch (err) {
    calls.delete(id);
    reply?.port.postMessage({ id: reply.pageId, status: 'error', error: unreachable(err.message) });
  }
}

function fromHost(message) {
  if (message.event) {
    const port = monitors.get(`${message.event.origin}\n${message.event.monitor}`);
    port?.postMessage({ event: { monitor: message.event.monitor, doc: message.event.doc } });
    return;
  }
  const call = calls.get(message.id);
  if (!call) return;
  calls.delete(message.id);
  call.port.postMessage({ id: call.pageId, status: message.status, data: message.data, error: message.error });
}

chrome.runtime.onConnect.addListener((port) => {
  if (port.name !== 'daop') return;
  const origin = port.sender?.origin;
  if (typeof origin !== 'string' || !/^https?:\/\//.test(origin)) {
    port.disconnect();
    return;
  }
  const mine = new Set(); // this page's monitors: deleted when the page goes away
  port.onMessage.addListener(({ id, method, body }) => {
    const monitor = body?.monitor;
    if (method === 'monitors/create' && typeof monitor === 'string') {
      monitors.set(`${origin}\n${monitor}`, port);
      mine.add(monitor);
    } else if (method === 'monitors/delete' && typeof monitor === 'string') {
      mine.delete(monitor);
    }
    toHost(origin, method, body, { port, pageId: id });
  });
  port.onDisconnect.addListener(() => {
    for (const monitor of mine) {
      if (monitors.get(`${origin}\n${monitor}`) !== port) continue;
      monitors.delete(`${origin}\n${monitor}`);
      if (native) toHost(origin, 'monitors/delete', { monitor }, null);
    }
  });
});
