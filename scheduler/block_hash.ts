/**
 * Prefix-cache block keys: 64-bit FNV-1a over the little-endian bytes of the block's u32 token
 * ids, seeded with the parent block's key (the FNV offset basis for the first block), so a key
 * names a whole prefix. Deterministic across runs and platforms. Collisions are possible in
 * principle; the block manager compares token ids and parent identity on every hit.
 *
 * @module
 */

/** A block key: 16 lowercase hex digits. */
export type BlockHash = string;

const OFFSET_HI = 0xcbf29ce4;
const OFFSET_LO = 0x84222325;
const TWO32 = 4294967296;

/**
 * The key a salted sequence's first block takes as its parent's (`NewRequest.cacheSalt`): FNV-1a
 * over the salt's UTF-16 code units, so salted prefixes never share keys with unsalted ones or
 * with other salts' (up to collisions, which the block manager's checks catch).
 */
export function saltKey(salt: string): BlockHash {
  const units = Array.from({ length: salt.length }, (_, i) => salt.charCodeAt(i));
  // The unit count first: a salt never hashes like a block of tokens.
  return hashBlock(null, [0xffffffff, units.length, ...units], 0, units.length + 2);
}

/**
 * Key of the block holding `tokens[start..end)` whose parent block has key `parent` (null for
 * the first block of a sequence).
 */
export function hashBlock(
  parent: BlockHash | null,
  tokens: ArrayLike<number>,
  start: number,
  end: number,
): BlockHash {
  let hi = OFFSET_HI;
  let lo = OFFSET_LO;
  if (parent !== null) {
    hi = parseInt(parent.slice(0, 8), 16);
    lo = parseInt(parent.slice(8), 16);
  }
  for (let i = start; i < end; i++) {
    const t = tokens[i]! >>> 0;
    for (let shift = 0; shift < 32; shift += 8) {
      lo = (lo ^ ((t >>> shift) & 0xff)) >>> 0;
      // (hi:lo) *= 0x100000001b3 mod 2^64, i.e. (x << 40) + x * 0x1b3.
      const p = lo * 0x1b3; // < 2^41, exact in a double
      const carry = Math.floor(p / TWO32);
      hi = (Math.imul(hi, 0x1b3) + carry + (lo << 8)) >>> 0;
      lo = p >>> 0;
    }
  }
  return hi.toString(16).padStart(8, "0") + lo.toString(16).padStart(8, "0");
}
