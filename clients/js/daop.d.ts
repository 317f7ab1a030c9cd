// Types of daop.js (and webnn.js, which it re-exports): DAOP for web pages, answered by a daop-agent over MQTT
// over WebSockets (docs/web.md).

export type Tier = 'excellent' | 'good' | 'fair' | 'moderate' | 'slow' | 'very-slow' | 'poor';

/** The tiers, best first. */
export const TIERS: readonly Tier[];

/** An MLGraph (MLGraphBuilder's), `.webnn` text, a webnn-graph-json object, or the bytes of an ONNX model
 *  (weights may be absent). */
export type Graph = MLGraph | string | object | ArrayBuffer | ArrayBufferView;

/** 'float32', 'float16', 'int32', 'int64', 'uint8', ... (docs/webnn-format.md). */
export type DataType = string;

/** WebNN's MLOperandDescriptor, with the explainer's `label` (a weightless constant's late-binding name). */
export interface OperandDescriptor {
  shape: Array<number | string>;
  dataType: DataType;
  label?: string;
}

/** The shapes the graph runs at: `{input: {shape: [1, 3, 720, 1280], dataType: 'float32'}}` (or `{input: [1, 3,
 *  720, 1280]}`). They bind the dimensions the graph leaves symbolic and re-bind those it fixed. */
export type InputDescriptors = Record<string, number[] | { shape: number[]; dataType?: DataType }>;
/** @deprecated the first name of InputDescriptors */
export type Inputs = InputDescriptors;

/** WebNN's MLContextOptions, as the agent takes them. `deviceType` is a hint (webnn#809): a device without an
 *  NPU answers `npu` for its next best device, as a browser's context falls back. */
export interface ContextOptions {
  deviceType?: 'cpu' | 'gpu' | 'npu';
  powerPreference?: 'default' | 'high-performance' | 'low-power' | 'fallback';
  accelerated?: boolean;
}

/** The explainer's MLQoSOptions (`weightsSparsity` is not used), with this context's options per call. */
export interface RequestOptions extends ContextOptions {
  inputDescriptors?: InputDescriptors;
  /** @deprecated the first name of inputDescriptors */
  inputs?: InputDescriptors;
}

export interface MonitorOptions extends RequestOptions {
  /** The monitor's id (1 to 64 of A-Z a-z 0-9 _ -); an id that exists on the agent is replaced. Default: random. */
  monitor?: string;
}

/** The WebNN operators the agent imports: each is a method of MLGraphBuilder. */
export const OPERATOR_NAMES: readonly string[];
/** Each operator's options that it also takes positionally, in order (reshape: newShape). */
export const OPERATORS: Readonly<Record<string, readonly string[]>>;

export class MLOperand {
  /** Its name in the built graph. */
  readonly id: string;
  /** Known for inputs and constants; an operator result's shape is inferred and checked by the agent. */
  readonly dataType: DataType | undefined;
  readonly shape: Array<number | string> | undefined;
}

/** A built graph; `toJSON()` is its webnn-graph-json, weightless. */
export class MLGraph {
  toJSON(): object;
}

/** WebNN's MLGraphBuilder, weightless: every operator of OPERATOR_NAMES is a method taking operands, then
 *  positional options (`reshape(x, newShape)`), then an options object (`conv2d(x, w, {strides: [2, 2]})`). */
export class MLGraphBuilder {
  constructor(context?: unknown);
  input(name: string, descriptor: OperandDescriptor): MLOperand;
  /** `({shape, dataType, label})` weightless; `(descriptor, bufferView)` with values; `(dataType, number)` a scalar. */
  constant(descriptor: OperandDescriptor, values?: ArrayBuffer | ArrayBufferView): MLOperand;
  constant(dataType: DataType, value: number): MLOperand;
  /** `build()`: every operator result nothing else reads is an output; `build({name: operand})` as WebNN. */
  build(outputs?: Record<string, MLOperand>): MLGraph;
  [op: string]: any;
}

/** The explainer's MLQoSReport. As a string (`${report}`, `report == 'good'`) it is its tier. */
export class QoSReport {
  readonly performanceTier: Tier;
  toString(): Tier;
}

/** The explainer's MLQoSChangeEvent. */
export class QoSChangeEvent extends Event {
  readonly meetsRequirement: boolean;
  readonly detail: ChangeDetail;
}

/** What `daop-agent web-credentials --json` prints. */
export interface ConnectOptions {
  /** The broker's WebSockets URL, e.g. ws://127.0.0.1:18831 */
  url: string;
  /** The agent's device id (topic base daop/<deviceId>/). */
  deviceId: string;
  username?: string;
  password?: string;
  /** How long to wait for the broker and for each answer (default 30,000). */
  timeoutMs?: number;
  /** Ask under this client's own scope daop/<deviceId>/client/<owner>/ (its broker user name, as the ACL
   *  allows): its monitors are its own. Default: the shared, unscoped topics. */
  owner?: string;
  deviceType?: ContextOptions['deviceType'];
  powerPreference?: ContextOptions['powerPreference'];
  accelerated?: boolean;
}

/** An error answer of the agent (codes in docs/mqtt.md), or 'timeout', 'closed', 'not_authorized', 'unreachable'. */
export class DaopError extends Error {
  readonly name: 'DaopError';
  readonly code: string;
  constructor(code: string, message: string);
}

export interface ChangeDetail {
  meetsRequirement: boolean;
  seq: number;
  /** The agent's UTC time of the change (ISO 8601), null when the message carried none. */
  ts: string | null;
}

export class QoSMonitor extends EventTarget {
  readonly id: string;
  readonly requiredTier: Tier;
  /** The latest value: true while the graph runs within the tier on this device (false until the agent answers). */
  readonly meetsRequirement: boolean;
  /** Why the agent would not register it (also an `error` event, and `ready` rejects); null otherwise. */
  readonly error: DaopError | null;
  /** Resolves once the agent has registered it. */
  readonly ready: Promise<QoSMonitor>;
  /** Called on each change, as a `change` event listener: `event.meetsRequirement`. */
  onchange: ((this: QoSMonitor, event: QoSChangeEvent) => void) | null;
  onerror: ((this: QoSMonitor, event: Event) => void) | null;
  addEventListener(type: 'change', listener: (event: QoSChangeEvent) => void,
                   options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null,
                   options?: boolean | AddEventListenerOptions): void;
  /** Delete the monitor on the agent; no more events. */
  close(): Promise<void>;
}

/** The explainer's calls on a context, whatever carries them (daop.js: MQTT; the extension: native messaging). */
export class QoSContext extends EventTarget {
  readonly contextOptions: Readonly<ContextOptions>;
  /** The explainer's estimateQoS: resolves with `{performanceTier}`. */
  estimateQoS(graph: Graph, options?: RequestOptions): Promise<QoSReport>;
  /** The tier alone. */
  estimateTier(graph: Graph, options?: RequestOptions): Promise<Tier>;
  meetsRequirement(graph: Graph, tier: Tier, options?: RequestOptions): Promise<boolean>;
  /** The monitor at once, registered in the background (`await monitor.ready` to wait for it). */
  createQoSMonitor(graph: Graph, tier: Tier, options?: MonitorOptions): QoSMonitor;
}

export class DaopContext extends QoSContext {
  readonly deviceId: string;
  /** The client scope it asks under (ConnectOptions.owner); undefined: the shared, unscoped topics. */
  readonly owner: string | undefined;
  /**
   * false while the agent is stopped or its broker unreachable; null when no agent ever ran with this device id
   * on this broker (connect() waits up to 2 s for its retained status); a `statuschange` event says when it changes.
   */
  readonly agentOnline: boolean | null;
  /** Delete this context's monitors on the agent, then disconnect. */
  close(): Promise<void>;
}

export function connect(options: ConnectOptions): Promise<DaopContext>;

/** navigator.ml's createContext, answered by the agent behind `options`. */
export function createML(options: ConnectOptions): { createContext(options?: ContextOptions): Promise<DaopContext> };
