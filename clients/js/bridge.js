// The browser extension's API for a page (clients/js/extension/, docs/web.md "The browser extension"): no
// broker, no password in the page; each page's origin is its own owner on the agent.
//
//   import { extensionML } from './bridge.js';
//   const ml = extensionML();            // a DaopError 'unreachable' where the extension is not installed
//   const context = await ml.createContext({deviceType: 'npu'});
//
// Where the browser has no WebNN the extension also gives `navigator.ml` and `MLGraphBuilder`, so the
// explainer's code runs as it is written.

import { DaopError } from './webnn.js';

/** The extension's navigator.ml part (`createContext`), or a DaopError 'unreachable' saying it is not there. */
export function extensionML() {
  const ml = globalThis.daop?.ml;
  if (ml && typeof ml.createContext === 'function') return ml;
  throw new DaopError('unreachable', 'agent not reachable: the DAOP browser extension is not installed in this '
    + 'browser (docs/web.md, "The browser extension")');
}
