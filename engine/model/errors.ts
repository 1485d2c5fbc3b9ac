/**
 * Domain errors of checkpoint loading. Each carries a one-line message that starts with the
 * file or tensor it is about, fit for a CLI or an HTTP error body; the original cause, when
 * there is one, is kept in `cause`.
 *
 * @module
 */

/**
 * A checkpoint file is missing, truncated or malformed, or a tensor is missing, has the wrong
 * shape or an unsupported dtype. The message starts with the file path or the tensor name.
 */
export class CheckpointError extends Error {
  override name = "CheckpointError";
}

/**
 * `config.json` or `generation_config.json` is invalid or describes an unsupported model. A
 * {@linkcode CheckpointError}, so one `catch` handles every loading error. The message starts
 * with the file name.
 */
export class ConfigError extends CheckpointError {
  override name = "ConfigError";
}

/** A short JSON rendering of a config value for error messages (cut at 60 characters). */
export function describeValue(v: unknown): string {
  const s = JSON.stringify(v);
  return s === undefined ? String(v) : s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

/** `value`, or a {@linkcode ConfigError} `<source>: missing required field "<field>"`. */
export function requiredField<T>(source: string, value: T | null | undefined, field: string): T {
  if (value === undefined || value === null) {
    throw new ConfigError(`${source}: missing required field "${field}"`);
  }
  return value;
}
