import assert from "node:assert/strict";
import { samplerRowsFor } from "../engine/sampler.ts";

Deno.test("samplerRowsFor() allows sub-batches only where their LM head inputs align", () => {
  // 64 rows x 1,024 x 4 bytes: every sub-batch starts on a 256-byte offset.
  assert.equal(samplerRowsFor(64, 1024, 512), 512);
  assert.equal(samplerRowsFor(4, 64, 32), 32);
  // 3 rows x 20 x 4 = 240 bytes: the second sub-batch would start off a binding offset.
  assert.equal(samplerRowsFor(3, 20, 30), 3);
  // Never below max_num_seqs.
  assert.equal(samplerRowsFor(64, 1024, 10), 64);
  assert.equal(samplerRowsFor(64, 1024, 64), 64);
});
