/**
 * A one-line progress bar on stderr, redrawn in place (at most ten times a second) while a level
 * runs: label, bar, requests done / total, failures, elapsed seconds.
 *
 * @module
 */

/** Something that takes bytes synchronously, like `Deno.stderr`. */
export interface SyncWriter {
  writeSync(p: Uint8Array): number;
}

/** Progress of one level; a disabled bar does nothing. */
export class ProgressBar {
  readonly #out: SyncWriter | null;
  readonly #label: string;
  readonly #total: number;
  readonly #t0 = performance.now();
  readonly #encoder = new TextEncoder();
  #lastDraw = -Infinity;
  #done = 0;
  #failed = 0;

  /** `out` null disables the bar. */
  constructor(out: SyncWriter | null, label: string, total: number) {
    this.#out = out;
    this.#label = label;
    this.#total = total;
    this.#draw(true);
  }

  /** Records one finished request. */
  tick(ok: boolean): void {
    this.#done++;
    if (!ok) this.#failed++;
    this.#draw(this.#done === this.#total);
  }

  /** Draws the final state and ends the line. */
  finish(): void {
    this.#draw(true);
    this.#write("\n");
  }

  /** The text of the bar (without the carriage return), for tests. */
  line(): string {
    const width = 30;
    const filled = this.#total === 0 ? width : Math.round((this.#done / this.#total) * width);
    const bar = "#".repeat(filled) + ".".repeat(width - filled);
    const secs = ((performance.now() - this.#t0) / 1000).toFixed(1);
    return `${this.#label} [${bar}] ${this.#done}/${this.#total} failed ${this.#failed} ${secs}s`;
  }

  #draw(force: boolean): void {
    const now = performance.now();
    if (!force && now - this.#lastDraw < 100) return;
    this.#lastDraw = now;
    this.#write(`\r\x1b[2K${this.line()}`);
  }

  #write(s: string): void {
    if (this.#out === null) return;
    const bytes = this.#encoder.encode(s);
    let off = 0;
    while (off < bytes.length) off += this.#out.writeSync(bytes.subarray(off));
  }
}
