// DAOP as the explainer writes it, whatever carries the requests: a weightless MLGraphBuilder, the
// estimateQoS / meetsRequirement / createQoSMonitor calls, their report and event shapes. No dependencies:
// daop.js carries the requests over MQTT over WebSockets, the browser extension (clients/js/extension/)
// through its native messaging host. docs/web.md.
//
//   const builder = new MLGraphBuilder(context);
//   const weights = builder.constant({shape: [3, 3, 64, 64], dataType: 'float32', label: 'modelWeights'});
//   const input = builder.input('input', {shape: [1, 3, 224, 224], dataType: 'float32'});
//   const graph = builder.build();                  // or builder.build({output: builder.conv2d(input, weights)})
//   const qos = await context.estimateQoS(graph, {inputDescriptors: {input: {shape: [1, 3, 720, 1280]}}});
//   qos.performanceTier                              // 'fair'
//
// Types: daop.d.ts.

/** The tiers, best first (contract: excellent < 16 ms ... poor >= 60 s). */
export const TIERS = Object.freeze(['excellent', 'good', 'fair', 'moderate', 'slow', 'very-slow', 'poor']);

/** An error answer of the agent (`code` as in docs/mqtt.md), or `timeout`, `closed`, `not_authorized`, `unreachable`. */
export class DaopError extends Error {
  /** @param {string} code @param {string} message */
  constructor(code, message) {
    super(message);
    this.name = 'DaopError';
    this.code = code;
  }
}

export function randomHex(bytes) {
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)), (b) => b.toString(16).padStart(2, '0')).join('');
}

function base64(bytes) {
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

// ------------------------------------------------------------------------------------------------ the builder

// The WebNN operators the agent imports (monitors/graphs/webnn_ops.py OPS; tests/test_web_builder.py keeps the
// two lists equal): op -> the options it also takes positionally, in order. Operands come first; a trailing
// plain object is the options. `split` has several outputs.
export const OPERATORS = Object.freeze({
  abs: [], add: [], argMax: ['axis'], argMin: ['axis'], averagePool2d: [], batchNormalization: [], cast: ['type'],
  ceil: [], clamp: [], concat: ['axis'], conv2d: [], convTranspose2d: [], cos: [], cumulativeSum: ['axis'],
  dequantizeLinear: [], div: [], elu: [], equal: [], erf: [], exp: [], expand: ['newShape'], floor: [], gather: [],
  gatherElements: [], gatherND: [], gelu: [], gemm: [], greater: [], greaterOrEqual: [], hardSigmoid: [],
  hardSwish: [], identity: [], instanceNormalization: [], isInfinite: [], isNaN: [], l2Pool2d: [],
  layerNormalization: [], leakyRelu: [], lesser: [], lesserOrEqual: [], linear: [], log: [], logicalAnd: [],
  logicalNot: [], logicalOr: [], logicalXor: [], matmul: [], max: [], maxPool2d: [], min: [], mul: [], neg: [],
  notEqual: [], pad: ['beginningPadding', 'endingPadding'], pow: [], prelu: [], quantizeLinear: [], reciprocal: [],
  reduceL1: [], reduceL2: [], reduceLogSum: [], reduceLogSumExp: [], reduceMax: [], reduceMean: [], reduceMin: [],
  reduceProduct: [], reduceSum: [], reduceSumSquare: [], relu: [], resample2d: [], reshape: ['newShape'],
  reverse: [], roundEven: [], sigmoid: [], sign: [], sin: [], slice: ['starts', 'sizes'], softmax: ['axis'],
  softplus: [], softsign: [], split: ['splits'], sqrt: [], squeeze: [], sub: [], tan: [], tanh: [],
  tile: ['repetitions'], transpose: [], triangular: [], unsqueeze: [], where: [],
});
export const OPERATOR_NAMES = Object.freeze(Object.keys(OPERATORS));
const MULTI_OUTPUT = new Set(['split']);
const MAX_INLINE_BYTES = 1 << 18; // small constants with data travel inline (their values can matter for shapes)

/** An operand of one MLGraphBuilder: an input, a constant, or an operator's result. */
export class MLOperand {
  #builder;
  constructor(builder, id, descriptor) {
    this.#builder = builder;
    /** Its name in the graph the builder builds (webnn-graph-json's operand id). */
    this.id = id;
    /** Known for inputs and constants; an operator's result's shape is inferred (and checked) by the agent. */
    this.dataType = descriptor?.dataType;
    this.shape = descriptor?.shape ? [...descriptor.shape] : undefined;
  }

  _of(builder) {
    return this.#builder === builder;
  }
}

/** A built graph: what `estimateQoS` and the others send (`toJSON()` is its webnn-graph-json). */
export class MLGraph {
  #json;
  constructor(json) {
    this.#json = json;
    Object.freeze(this);
  }

  /** The graph as webnn-graph-json (docs/webnn-format.md), weightless: constants are descriptors and labels. */
  toJSON() {
    return structuredClone(this.#json);
  }
}

function checkDescriptor(descriptor, where, isConstant) {
  if (descriptor === null || typeof descriptor !== 'object') throw new TypeError(`${where}: a descriptor is {shape, dataType}`);
  const unknown = Object.keys(descriptor).filter((k) => !['shape', 'dataType', 'label', 'dimensions'].includes(k));
  if (unknown.length) throw new TypeError(`${where}: unknown descriptor key '${unknown[0]}'`);
  const shape = descriptor.shape ?? descriptor.dimensions ?? [];
  if (!Array.isArray(shape) || !shape.every((d) => (Number.isInteger(d) && d >= 1) || (!isConstant && typeof d === 'string' && d))) {
    throw new TypeError(`${where}: shape must be a list of positive integers, not ${JSON.stringify(shape)}`);
  }
  if (typeof descriptor.dataType !== 'string') throw new TypeError(`${where}: dataType is missing`);
  if (descriptor.label !== undefined && (typeof descriptor.label !== 'string' || !descriptor.label)) {
    throw new TypeError(`${where}: label must be a non-empty string`);
  }
  return { shape: [...shape], dataType: descriptor.dataType, label: descriptor.label };
}

/**
 * WebNN's MLGraphBuilder, weightless: `constant({shape, dataType, label})` declares weights without their bytes,
 * every operator the agent imports is a method (`builder.conv2d(input, filter, {strides: [2, 2]})`), and
 * `build()` gives the graph the agent estimates. Nothing runs here: the agent checks the graph and infers its
 * shapes, and names the node of any fault in its error.
 */
export class MLGraphBuilder {
  #inputs = {};
  #consts = {};
  #nodes = [];
  #used = new Set();
  #consumed = new Set();
  #produced = [];
  #built = false;

  /** @param {object} [context] the context it builds for (kept, not needed: building is the same for all) */
  constructor(context) {
    this.context = context;
    for (const op of OPERATOR_NAMES) {
      Object.defineProperty(this, op, { value: (...args) => this.#call(op, args), enumerable: false });
    }
  }

  #name(base) {
    let name = base;
    for (let k = 2; this.#used.has(name); k++) name = `${base}_${k}`;
    this.#used.add(name);
    return name;
  }

  #own(operand, where) {
    if (!(operand instanceof MLOperand) || !operand._of(this)) {
      throw new TypeError(`${where}: ${String(operand)} is not an operand of this builder`);
    }
    return operand.id;
  }

  #open(where) {
    if (this.#built) throw new DaopError('bad_graph', `${where}: this builder has built its graph already`);
  }

  /** A graph input; a dimension given as a string stays symbolic (its size comes from inputDescriptors). */
  input(name, descriptor) {
    this.#open('input');
    if (typeof name !== 'string' || !name) throw new TypeError('input: the name must be a non-empty string');
    if (this.#used.has(name)) throw new TypeError(`input: the name '${name}' is taken`);
    const desc = checkDescriptor(descriptor, `input '${name}'`, false);
    this.#used.add(name);
    this.#inputs[name] = { dataType: desc.dataType, shape: desc.shape };
    return new MLOperand(this, name, desc);
  }

  /**
   * A constant: `({shape, dataType, label})` weightless (the label names its weights for late binding),
   * `(descriptor, bufferView)` with values (small ones travel inline), or `(dataType, number)` a scalar.
   */
  constant(descriptor, values) {
    this.#open('constant');
    if (typeof descriptor === 'string') {
      if (typeof values !== 'number') throw new TypeError('constant(dataType, value): the value must be a number');
      const id = this.#name('constant');
      this.#consts[id] = { dataType: descriptor, shape: [], init: { kind: 'scalar', value: values } };
      return new MLOperand(this, id, { dataType: descriptor, shape: [] });
    }
    const desc = checkDescriptor(descriptor, 'constant', true);
    const id = this.#name(desc.label ?? 'constant');
    const decl = { dataType: desc.dataType, shape: desc.shape };
    if (desc.label !== undefined) decl.label = desc.label;
    if (values !== undefined) {
      const view = values instanceof ArrayBuffer ? new Uint8Array(values)
        : ArrayBuffer.isView(values) ? new Uint8Array(values.buffer, values.byteOffset, values.byteLength) : null;
      if (!view) throw new TypeError('constant: values must be an ArrayBuffer or a typed array');
      if (view.byteLength <= MAX_INLINE_BYTES) decl.init = { kind: 'inlineBytes', bytes: Array.from(view) };
    }
    this.#consts[id] = decl;
    return new MLOperand(this, id, desc);
  }

  #call(op, args) {
    this.#open(op);
    const where = `${op} #${this.#nodes.length + 1}`;
    const positional = [...OPERATORS[op]];
    const inputs = [];
    let options = {};
    args.forEach((arg, i) => {
      if (arg instanceof MLOperand) inputs.push(this.#own(arg, where));
      else if (Array.isArray(arg) && arg.length && arg.every((a) => a instanceof MLOperand)) {
        inputs.push(...arg.map((a) => this.#own(a, where)));
      } else if (i === args.length - 1 && arg !== null && typeof arg === 'object' && !Array.isArray(arg)) Object.assign(options, arg);
      else if (positional.length) options[positional.shift()] = arg;
      else if (arg !== undefined) throw new TypeError(`${where}: unexpected argument ${JSON.stringify(arg)}`);
    });
    for (const [key, value] of Object.entries(options)) {
      if (value instanceof MLOperand) options[key] = this.#own(value, where);
      else if (value === undefined) delete options[key];
    }
    const label = typeof options.label === 'string' && options.label ? options.label : op;
    delete options.label;
    const id = this.#name(label);
    let outputs = [id];
    if (MULTI_OUTPUT.has(op)) {
      const splits = options.splits;
      const count = Array.isArray(splits) ? splits.length : splits;
      if (!Number.isInteger(count) || count < 1) throw new TypeError(`${where}: splits must be a count or a list of sizes`);
      outputs = Array.from({ length: count }, (_, k) => this.#name(`${id}.${k}`));
    }
    const node = { id, op, inputs, options };
    if (outputs.length > 1 || outputs[0] !== id) node.outputs = outputs;
    this.#nodes.push(node);
    for (const name of inputs) this.#consumed.add(name);
    for (const value of Object.values(options)) if (typeof value === 'string' && this.#used.has(value)) this.#consumed.add(value);
    this.#produced.push(...outputs);
    const results = outputs.map((name) => new MLOperand(this, name, null));
    return MULTI_OUTPUT.has(op) ? results : results[0];
  }

  /**
   * The graph: `build({name: operand, ...})` as WebNN names its outputs, or `build()` as the explainer writes it:
   * every operator result nothing else reads is an output. Usable with or without `await`.
   * @returns {MLGraph}
   */
  build(outputs) {
    this.#open('build');
    let named;
    if (outputs === undefined) {
      named = Object.fromEntries(this.#produced.filter((id) => !this.#consumed.has(id)).map((id) => [id, id]));
    } else {
      if (outputs === null || typeof outputs !== 'object') throw new TypeError('build: outputs are {name: operand}');
      named = Object.fromEntries(Object.entries(outputs).map(([name, operand]) => [name, this.#own(operand, `output '${name}'`)]));
    }
    if (!Object.keys(named).length) throw new DaopError('bad_graph', 'build: the graph has no operator to compute');
    this.#built = true;
    return new MLGraph({ format: 'webnn-graph-json', version: 1, name: 'webnn', inputs: this.#inputs,
      consts: this.#consts, nodes: this.#nodes, outputs: named });
  }
}

// ------------------------------------------------------------------------------------------------ requests

/** The request's model field: an MLGraph, `.webnn` text, a webnn-graph-json object, or ONNX bytes. */
export function modelFields(graph) {
  if (graph instanceof MLGraph) return { graph: graph.toJSON() };
  if (typeof graph === 'string') return { webnn: graph };
  if (graph instanceof ArrayBuffer) return { onnx: base64(new Uint8Array(graph)) };
  if (ArrayBuffer.isView(graph)) return { onnx: base64(new Uint8Array(graph.buffer, graph.byteOffset, graph.byteLength)) };
  if (graph !== null && typeof graph === 'object') return { graph };
  throw new TypeError('a graph is an MLGraph, .webnn text, a webnn-graph-json object, or ONNX bytes');
}

/** `inputDescriptors` (the explainer's) or `inputs` (this client's first name for them) -> the request's `inputs`:
 *  `{name: {shape, dataType}}`, or `{name: [1, 3, 224, 224]}`. */
export function inputFields({ inputDescriptors, inputs } = {}) {
  if (inputDescriptors !== undefined && inputs !== undefined) {
    throw new TypeError('give inputDescriptors or inputs (its older name), not both');
  }
  const given = inputDescriptors ?? inputs;
  if (given === undefined) return {};
  if (given === null || typeof given !== 'object') throw new TypeError('inputDescriptors are {name: {shape, dataType}}');
  const out = {};
  for (const [name, spec] of Object.entries(given)) {
    if (Array.isArray(spec)) out[name] = { shape: spec };
    else if (spec !== null && typeof spec === 'object') {
      out[name] = { shape: spec.shape ?? spec.dimensions };
      if (spec.dataType !== undefined) out[name].dataType = spec.dataType;
    } else throw new TypeError(`inputDescriptors.${name} is {shape, dataType}`);
  }
  return { inputs: out };
}

const CONTEXT_KEYS = ['deviceType', 'powerPreference', 'accelerated'];

/**
 * WebNN's MLContextOptions as the agent takes them. `deviceType` is a hint, as in WebNN since webnn#809 (where
 * powerPreference and accelerated replace it): 'cpu' asks for no accelerator, 'gpu' for one, 'npu' for the
 * low-power one; a device without it answers for the next best, as a browser's context falls back.
 */
export function contextFields(options = {}) {
  const out = {};
  for (const key of CONTEXT_KEYS) if (options[key] !== undefined) out[key] = options[key];
  const device = out.deviceType;
  delete out.deviceType;
  if (device === undefined) return out;
  if (!['cpu', 'gpu', 'npu'].includes(device)) throw new TypeError(`deviceType must be 'cpu', 'gpu' or 'npu', not ${JSON.stringify(device)}`);
  if (device === 'cpu') out.accelerated ??= false;
  else {
    out.accelerated ??= true;
    if (device === 'npu') out.powerPreference ??= 'low-power';
  }
  return out;
}

function requestBody(context, graph, options, extra = {}) {
  return { ...modelFields(graph), ...inputFields(options), ...contextFields({ ...context.contextOptions, ...options }), ...extra };
}

/** What estimateQoS resolves with: the explainer's MLQoSReport. As a string it is its tier (this client's
 *  first estimateQoS resolved with the bare tier: `${report}` and `report == 'good'` keep working). */
export class QoSReport {
  constructor(performanceTier) {
    this.performanceTier = performanceTier;
    Object.freeze(this);
  }

  toString() {
    return this.performanceTier;
  }

  [Symbol.toPrimitive]() {
    return this.performanceTier;
  }

  toJSON() {
    return { performanceTier: this.performanceTier };
  }
}

/** The explainer's MLQoSChangeEvent: `event.meetsRequirement`; `event.detail` holds it too, with seq and ts. */
export class QoSChangeEvent extends Event {
  constructor(type, { meetsRequirement, seq, ts }) {
    super(type);
    this.meetsRequirement = meetsRequirement;
    this.detail = { meetsRequirement, seq, ts };
  }
}

/**
 * The calls of the explainer on a context, over whatever transport the subclass gives: `_request(method, body)`
 * resolves with an answer's `data` or rejects with a DaopError; `_watch(id)` resolves once the monitor's state
 * and events reach `_monitorMessage`; `_unwatch(id)` stops them.
 */
export class QoSContext extends EventTarget {
  _monitors = new Map(); // id -> QoSMonitor

  /** @param {object} [contextOptions] deviceType, powerPreference, accelerated: sent with every request */
  constructor(contextOptions = {}) {
    super();
    contextFields(contextOptions); // refuse a bad one now
    this.contextOptions = Object.freeze(Object.fromEntries(CONTEXT_KEYS.filter((k) => contextOptions[k] !== undefined)
      .map((k) => [k, contextOptions[k]])));
  }

  /**
   * The explainer's estimateQoS: `{performanceTier}` of one inference of `graph` on this device, now.
   * @returns {Promise<QoSReport>}
   */
  async estimateQoS(graph, options = {}) {
    return new QoSReport((await this._request('estimate', requestBody(this, graph, options))).performanceTier);
  }

  /** The tier alone: `(await estimateQoS(graph, options)).performanceTier`. */
  async estimateTier(graph, options = {}) {
    return (await this.estimateQoS(graph, options)).performanceTier;
  }

  /**
   * Whether `graph` runs within `tier` (or better) on this device, now.
   * @returns {Promise<boolean>}
   */
  async meetsRequirement(graph, tier, options = {}) {
    return (await this._request('meets', requestBody(this, graph, options, { requiredTier: tier }))).meetsRequirement;
  }

  /**
   * A monitor, at once, as the explainer writes it: `monitor.onchange = (e) => e.meetsRequirement ...`. It is
   * registered with the agent in the background: `meetsRequirement` is false until the agent answers, and a
   * `change` event says when it turns true. `await monitor.ready` waits for the registration (and rejects with
   * its error, which an `error` event and `monitor.error` also carry).
   * @returns {QoSMonitor}
   */
  createQoSMonitor(graph, tier, options = {}) {
    const { monitor: id = randomHex(8) } = options;
    const body = requestBody(this, graph, options, { requiredTier: tier, monitor: id, ...this._createFields() });
    if (this._monitors.has(id)) throw new DaopError('bad_monitor_id', `monitor ${id} is already open here`);
    const monitor = new QoSMonitor(this, id, tier);
    this._monitors.set(id, monitor);
    monitor._start((async () => {
      await this._watch(id); // first, so that no change between the answer and the subscription is missed
      return (await this._request('monitors/create', body)).meetsRequirement;
    })());
    return monitor;
  }

  /** Fields a transport adds to each monitors/create (the WebSocket client's lease). */
  _createFields() {
    return {};
  }

  _monitorMessage(id, doc, retained) {
    this._monitors.get(id)?._message(doc, retained);
  }

  _forget(id) {
    if (this._monitors.delete(id)) this._unwatch(id);
  }
}

/**
 * A monitor registered with the agent. `meetsRequirement` is always the latest value; `change` events (and
 * `onchange`) fire when it changes, with `event.meetsRequirement` (and `event.detail = {meetsRequirement, seq, ts}`).
 */
export class QoSMonitor extends EventTarget {
  #context;
  #seq = -1;
  #answered = false;
  #closed = false;
  #early = null;

  constructor(context, id, tier) {
    super();
    this.#context = context;
    this.id = id;
    this.requiredTier = tier;
    /** @type {boolean} */
    this.meetsRequirement = false;
    /** @type {DaopError | null} why the agent would not register it */
    this.error = null;
    /** @type {((event: QoSChangeEvent) => void) | null} */
    this.onchange = null;
    /** @type {((event: Event) => void) | null} */
    this.onerror = null;
    this.addEventListener('change', (event) => this.onchange?.call(this, event));
    this.addEventListener('error', (event) => this.onerror?.call(this, event));
    /** @type {Promise<QoSMonitor>} resolves once the agent has registered it */
    this.ready = Promise.resolve(this);
  }

  _start(created) {
    this.ready = created.then((meets) => {
      this._created(meets);
      return this;
    }, (err) => {
      this.#closed = true;
      this.#context._forget(this.id);
      this.error = err;
      this.dispatchEvent(new Event('error'));
      throw err;
    });
    this.ready.catch(() => {}); // the error event and monitor.error say it; an unread ready is not unhandled
  }

  _created(meets) {
    this.#answered = true;
    if (this.#closed) return;
    if (this.#early) this.#change(this.#early.meetsRequirement, this.#early.seq, this.#early.ts ?? null); // newer
    else this.#change(meets, 0, null);
  }

  #change(meets, seq, ts) {
    if (meets === this.meetsRequirement) return;
    this.meetsRequirement = meets;
    this.dispatchEvent(new QoSChangeEvent('change', { meetsRequirement: meets, seq, ts }));
  }

  _message(doc, retained) {
    // Before the create answer, a retained state is a previous monitor's with this id: not ours yet.
    if (this.#closed || (!this.#answered && retained) || typeof doc.meetsRequirement !== 'boolean') return;
    if (typeof doc.seq !== 'number' || doc.seq <= this.#seq) return; // QoS 1 duplicates, state after event
    this.#seq = doc.seq;
    if (this.#answered) this.#change(doc.meetsRequirement, doc.seq, doc.ts ?? null);
    else this.#early = doc; // a live state or event before the create answer: newer than it, told by _created
  }

  /** Delete the monitor on the agent; no more events. */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#context._forget(this.id);
    try {
      await this.ready;
      await this.#context._request('monitors/delete', { monitor: this.id });
    } catch (err) {
      if (err.code !== 'unknown_monitor' && this.error === null) throw err; // already gone is what close() wants
    }
  }
}
