/**
 * Finds where HTTP/1.x messages begin and end in a byte stream, without buffering bodies: the
 * connection guard (server/connection_guard.ts) feeds it every chunk that passes between a client
 * and the server, and learns when a request head starts, when it is complete and when each
 * message ends, which is what its header and keep-alive deadlines need.
 *
 * Heads are kept until complete (at most `maxHeadBytes`); bodies are only counted: a fixed
 * `Content-Length`, `Transfer-Encoding: chunked` (chunk-size lines and trailers parsed, data
 * skipped), "until the connection closes", or none. The owner decides the body framing of each
 * head ({@linkcode FramerEvents.head}), since requests and responses follow different rules
 * (RFC 9112 section 6.3). After a protocol switch (`101`) the owner calls
 * {@linkcode Http1Framer.passThrough} and nothing more is parsed.
 *
 * @module
 */

/** A message head: its start line and its header fields (names lower-cased, in order). */
export interface MessageHead {
  /** `GET /health HTTP/1.1`, or `HTTP/1.1 200 OK`. */
  readonly startLine: string;
  /** Header fields, names lower-cased, values trimmed. */
  readonly fields: ReadonlyArray<readonly [string, string]>;
}

/** How the body after a head is delimited. */
export type BodyFraming =
  | { readonly kind: "none" }
  | { readonly kind: "length"; readonly bytes: number }
  | { readonly kind: "chunked" }
  | { readonly kind: "until-close" };

/** What a {@linkcode Http1Framer} reports, in stream order. */
export interface FramerEvents {
  /** The first byte of a new head arrived (leading empty lines are skipped). */
  headStart(): void;
  /** A head is complete; returns how its body is delimited. */
  head(head: MessageHead): BodyFraming;
  /** The message (head and body) is complete. */
  messageEnd(): void;
}

/** The byte stream is not HTTP/1.x, or a head or chunk line is too long. */
export class HttpFramingError extends Error {
  /** `431` for an oversized head, else `400`. */
  readonly status: number;
  constructor(message: string, status = 400) {
    super(message);
    this.name = "HttpFramingError";
    this.status = status;
  }
}

const CR = 13;
const LF = 10;
const MAX_LINE = 4096;

type State =
  | "idle"
  | "head"
  | "length"
  | "chunk-size"
  | "chunk-data"
  | "chunk-end"
  | "trailers"
  | "until-close"
  | "pass";

/** The framing rules of a request head: chunked, else `Content-Length`, else no body. */
export function requestBodyFraming(head: MessageHead): BodyFraming {
  const te = fieldValues(head, "transfer-encoding");
  if (te.length > 0) {
    if (!/(^|,)\s*chunked\s*$/i.test(te.join(","))) {
      throw new HttpFramingError("Transfer-Encoding of a request must end with chunked");
    }
    return { kind: "chunked" };
  }
  const length = contentLength(head);
  return length === null || length === 0 ? { kind: "none" } : { kind: "length", bytes: length };
}

/**
 * The framing rules of a response head to a request of method `method`: no body after `HEAD`,
 * `1xx`, `204`, `304`; chunked, else `Content-Length`, else until the connection closes.
 */
export function responseBodyFraming(head: MessageHead, method: string): BodyFraming {
  const status = statusOf(head);
  if (method === "HEAD" || status < 200 || status === 204 || status === 304) {
    return { kind: "none" };
  }
  const te = fieldValues(head, "transfer-encoding");
  if (te.length > 0) {
    return /(^|,)\s*chunked\s*$/i.test(te.join(","))
      ? { kind: "chunked" }
      : { kind: "until-close" };
  }
  const length = contentLength(head);
  if (length === null) return { kind: "until-close" };
  return length === 0 ? { kind: "none" } : { kind: "length", bytes: length };
}

/** The status code of a response head. */
export function statusOf(head: MessageHead): number {
  const match = /^HTTP\/\d\.\d (\d{3})/.exec(head.startLine);
  if (match === null) {
    throw new HttpFramingError(`Not a status line: ${head.startLine.slice(0, 80)}`);
  }
  return Number(match[1]);
}

/** The method of a request head. */
export function methodOf(head: MessageHead): string {
  const match = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+) \S+ HTTP\/\d\.\d$/.exec(head.startLine);
  if (match === null) {
    throw new HttpFramingError(`Not a request line: ${head.startLine.slice(0, 80)}`);
  }
  return match[1]!;
}

function fieldValues(head: MessageHead, name: string): string[] {
  return head.fields.filter(([n]) => n === name).map(([, v]) => v);
}

function contentLength(head: MessageHead): number | null {
  const values = fieldValues(head, "content-length").flatMap((v) => v.split(","));
  if (values.length === 0) return null;
  const distinct = new Set(values.map((v) => v.trim()));
  const [only] = distinct;
  if (distinct.size !== 1 || !/^\d{1,15}$/.test(only!)) {
    throw new HttpFramingError(`Invalid Content-Length: ${values.join(",").slice(0, 80)}`);
  }
  return Number(only);
}

/** Parses a complete head (its bytes up to and including the empty line). */
export function parseHead(bytes: Uint8Array): MessageHead {
  const lines = new TextDecoder("latin1").decode(bytes).split("\r\n");
  const startLine = lines[0] ?? "";
  const fields: Array<readonly [string, string]> = [];
  for (const line of lines.slice(1)) {
    if (line === "") continue;
    const colon = line.indexOf(":");
    if (colon <= 0 || /\s/.test(line[0]!)) {
      throw new HttpFramingError(`Invalid header line: ${line.slice(0, 80)}`);
    }
    fields.push([line.slice(0, colon).toLowerCase(), line.slice(colon + 1).trim()]);
  }
  return { startLine, fields };
}

/** The incremental framer; see the module documentation. */
export class Http1Framer {
  readonly #events: FramerEvents;
  readonly #maxHead: number;
  #state: State = "idle";
  #head: number[] = [];
  #line: number[] = [];
  #remaining = 0;

  /**
   * @param events receives the boundaries.
   * @param maxHeadBytes the largest head accepted (a longer one throws with status 431).
   */
  constructor(events: FramerEvents, maxHeadBytes = 64 * 1024) {
    this.#events = events;
    this.#maxHead = maxHeadBytes;
  }

  /** Whether a head has started and is not complete yet. */
  get inHead(): boolean {
    return this.#state === "head";
  }

  /** Whether the framer is between messages. */
  get idle(): boolean {
    return this.#state === "idle";
  }

  /** Stops parsing: every later byte passes uncounted (after a protocol switch). */
  passThrough(): void {
    this.#state = "pass";
  }

  /** Feeds the next bytes of the stream; throws {@linkcode HttpFramingError} on bad framing. */
  push(chunk: Uint8Array): void {
    let i = 0;
    while (i < chunk.length) i = this.#step(chunk, i);
  }

  /** Consumes bytes from `i` in the current state; returns the index after them. */
  #step(chunk: Uint8Array, i: number): number {
    switch (this.#state) {
      case "pass":
      case "until-close":
        return chunk.length;
      case "idle": {
        const byte = chunk[i]!;
        if (byte === CR || byte === LF) return i + 1;
        this.#state = "head";
        this.#head = [];
        this.#events.headStart();
        return i;
      }
      case "head":
        return this.#headBytes(chunk, i);
      case "length": {
        const n = Math.min(this.#remaining, chunk.length - i);
        this.#remaining -= n;
        if (this.#remaining === 0) this.#end();
        return i + n;
      }
      case "chunk-data": {
        const n = Math.min(this.#remaining, chunk.length - i);
        this.#remaining -= n;
        if (this.#remaining === 0) this.#state = "chunk-end";
        return i + n;
      }
      case "chunk-size":
      case "chunk-end":
      case "trailers":
        return this.#lineBytes(chunk, i);
    }
  }

  #headBytes(chunk: Uint8Array, i: number): number {
    const head = this.#head;
    for (; i < chunk.length; i++) {
      head.push(chunk[i]!);
      const n = head.length;
      if (n >= 4 && head[n - 1] === LF && head[n - 2] === CR && head[n - 3] === LF) {
        this.#startBody(this.#events.head(parseHead(Uint8Array.from(head))));
        return i + 1;
      }
      if (n > this.#maxHead) {
        throw new HttpFramingError(`Message head over ${this.#maxHead} bytes`, 431);
      }
    }
    return i;
  }

  #startBody(framing: BodyFraming): void {
    this.#head = [];
    switch (framing.kind) {
      case "none":
        return this.#end();
      case "length":
        this.#remaining = framing.bytes;
        this.#state = "length";
        return;
      case "chunked":
        this.#state = "chunk-size";
        this.#line = [];
        return;
      case "until-close":
        this.#state = "until-close";
        return;
    }
  }

  /** Collects one CRLF-terminated line (chunk size, chunk end, trailer). */
  #lineBytes(chunk: Uint8Array, i: number): number {
    for (; i < chunk.length; i++) {
      const byte = chunk[i]!;
      if (byte === LF) {
        const line = new TextDecoder("latin1").decode(Uint8Array.from(this.#line)).replace(
          /\r$/,
          "",
        );
        this.#line = [];
        this.#endOfLine(line);
        return i + 1;
      }
      this.#line.push(byte);
      if (this.#line.length > MAX_LINE) throw new HttpFramingError("Chunk line too long");
    }
    return i;
  }

  #endOfLine(line: string): void {
    if (this.#state === "chunk-end") {
      if (line !== "") throw new HttpFramingError("Chunk data longer than its size");
      this.#state = "chunk-size";
    } else if (this.#state === "trailers") {
      if (line === "") this.#end();
    } else {
      const match = /^([0-9a-fA-F]{1,12})\s*(;.*)?$/.exec(line);
      if (match === null) throw new HttpFramingError(`Invalid chunk size: ${line.slice(0, 40)}`);
      this.#remaining = parseInt(match[1]!, 16);
      this.#state = this.#remaining === 0 ? "trailers" : "chunk-data";
    }
  }

  #end(): void {
    this.#state = "idle";
    this.#events.messageEnd();
  }
}
