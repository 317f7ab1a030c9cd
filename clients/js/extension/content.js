// DAOP extension, isolated world: carries the page's calls (page.js posts them) to the service worker, and
// the answers and monitor events back. The service worker learns the page's origin from the browser
// (port.sender.origin), never from the page.
let port = null;

function connect() {
  if (port) return port;
  port = chrome.runtime.connect({ name: 'daop' });
  port.onMessage.addListener((message) => window.postMessage({ daop: message.event ? 'event' : 'answer', ...message }, '*'));
  port.onDisconnect.addListener(() => {
    port = null; // the service worker went away: the next call connects again; the page's monitors are gone
    window.postMessage({ daop: 'lost' }, '*');
  });
  return port;
}

window.addEventListener('message', (event) => {
  if (event.source !== window || event.data?.daop !== 'call') return;
  const { id, method, body } = event.data;
  try {
    connect().postMessage({ id, method, body });
  } catch (err) {
    window.postMessage({ daop: 'answer', id, status: 'error',
      error: { code: 'unreachable', message: `agent not reachable: ${err.message}` } }, '*');
  }
});
