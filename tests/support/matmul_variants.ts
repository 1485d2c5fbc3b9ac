/**
 * The matmul kernels the kernel tests force, as one list: every `MatmulVariant`, and `gemv4`,
 * the `gemv` kernel with 4 weight rows per invocation (`MatmulEncodeOptions.gemvRows`), which
 * the kernel tuning may choose per call-site shape.
 *
 * @module
 */

import type { MatmulEncodeOptions, MatmulVariant } from "../../kernels/matmul.ts";

/** A forced kernel of a test: a matmul variant, or `gemv4`. */
export type TestVariant = MatmulVariant | "gemv4";

/** Every kernel the tests force. */
export const TEST_VARIANTS: readonly TestVariant[] = [
  "tiled",
  "gemv",
  "gemv4",
  "blocked",
  "unrolled",
];

/** The encode options that force `variant` (undefined: the policy's choice). */
export function forced(variant: TestVariant | undefined): MatmulEncodeOptions {
  if (variant === "gemv4") return { variant: "gemv", gemvRows: 4 };
  return variant === undefined ? {} : { variant };
}
