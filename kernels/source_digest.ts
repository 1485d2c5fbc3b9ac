/**
 * A short digest of WGSL sources, so that a measurement cached against them (engine/
 * kernel_tuning.ts) is taken again once a kernel changes.
 *
 * @module
 */

/** FNV-1a (32-bit, hex) of the sources joined by NUL characters. */
export function sourceDigest(...sources: string[]): string {
  let h = 0x811c9dc5;
  const all = sources.join("\0");
  for (let i = 0; i < all.length; i++) h = Math.imul(h ^ all.charCodeAt(i), 0x01000193) >>> 0;
  return h.toString(16).padStart(8, "0");
}
