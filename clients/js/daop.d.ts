// Types of daop.js: DAOP for web pages, answered by a daop-agent over MQTT over WebSockets (docs/web.md).

export type Tier = 'excellent' | 'good' | 'fair' | 'moderate' | 'slow' | 'very-slow' | 'poor';

/** The tiers, best first. */
export const TIERS: readonly Tier[];

/** `.webnn` text, a webnn-graph-json object, or the bytes of an ONNX model (weights may be absent). */
export type Graph = string | object | ArrayBuffer | ArrayBufferView;

/** 'float32', 'float16', 'int32', 'int64', 'uint8', ... (docs/webnn-format.md). */
export type DataType = string;

/** Shapes for the dimensions the graph leaves symbolic: `{image: [1, 288, 512, 3]}` or `{image: {shape, dataType}}`. */
export type Inputs = Record<string, number[] | { shape: number[]; dataType?: DataType }>;

export interface RequestOptions {
  inputs?: Inputs;
}

export interface MonitorOptions extends RequestOptions {
  /** The monitor's id (1 to 64 of A-Z a-z 0-9 _ -); an id that exists on the agent is replaced. Default: random. */
  monitor?: string;
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
  /** The latest value: true while the graph runs within the tier on this device. */
  readonly meetsRequirement: boolean;
  /** Called on each change, as a `change` event listener. */
  onchange: ((this: QoSMonitor, event: CustomEvent<ChangeDetail>) => void) | null;
  addEventListener(type: 'change', listener: (event: CustomEvent<ChangeDetail>) => void,
                   options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null,
                   options?: boolean | AddEventListenerOptions): void;
  /** Delete the monitor on the agent; no more events. */
  close(): Promise<void>;
}

export class DaopContext extends EventTarget {
  readonly deviceId: string;
  /** The client scope it asks under (ConnectOptions.owner); undefined: the shared, unscoped topics. */
  readonly owner: string | undefined;
  /**
   * false while the agent is stopped or its broker unreachable; null when no agent ever ran with this device id
   * on this broker (connect() waits up to 2 s for its retained status); a `statuschange` event says when it changes.
   */
  readonly agentOnline: boolean | null;
  estimateQoS(graph: Graph, options?: RequestOptions): Promise<Tier>;
  meetsRequirement(graph: Graph, tier: Tier, options?: RequestOptions): Promise<boolean>;
  createQoSMonitor(graph: Graph, tier: Tier, options?: MonitorOptions): Promise<QoSMonitor>;
  /** Delete this context's monitors on the agent, then disconnect. */
  close(): Promise<void>;
}

export function connect(options: ConnectOptions): Promise<DaopContext>;
