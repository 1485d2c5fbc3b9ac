/**
 * A progress bar on stderr for weight loading and downloads (bytes, percent, rate), drawn only
 * when stderr is a terminal and redrawn at most ten times a second.
 *
 * @module
 */

const encoder = new TextEncoder();

function formatBytes(n: number): string {
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(2)} GiB`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  return `${(n / 1024).toFixed(0)} KiB`;
}

/** Tracks loaded bytes against a total and draws a bar. */
export class LoadProgress {
  readonly total: number;
  readonly #enabled: boolean;
  readonly #start = performance.now();
  #done = 0;
  #lastDraw = 0;

  readonly #label: string;

  /**
   * @param enabled draw at all (default: when stderr is a terminal).
   * @param label what the bar says it does.
   */
  constructor(total: number, enabled = Deno.stderr.isTerminal(), label = "Loading weights") {
    this.total = total;
    this.#enabled = enabled;
    this.#label = label;
  }

  /** Bytes loaded so far. */
  get done(): number {
    return this.#done;
  }

  /** Records `bytes` more and redraws if due. */
  advance(bytes: number): void {
    this.#done += bytes;
    const now = performance.now();
    if (this.#enabled && (now - this.#lastDraw > 100 || this.#done >= this.total)) {
      this.#lastDraw = now;
      this.#draw(now);
    }
  }

  /** Finishes the line. */
  finish(): void {
    if (this.#enabled) {
      this.#draw(performance.now());
      Deno.stderr.writeSync(encoder.encode("\n"));
    }
  }

  #draw(now: number): void {
    const frac = this.total > 0 ? Math.min(1, this.#done / this.total) : 1;
    const width = 30;
    const filled = Math.round(frac * width);
    const rate = this.#done / Math.max(1e-3, (now - this.#start) / 1000);
    const line = `\r${this.#label} [${"#".repeat(filled)}${" ".repeat(width - filled)}] ` +
      `${(frac * 100).toFixed(0).padStart(3)}% ${formatBytes(this.#done)} / ${
        formatBytes(this.total)
      } ` +
      `${formatBytes(rate)}/s `;
    Deno.stderr.writeSync(encoder.encode(line));
  }
}
