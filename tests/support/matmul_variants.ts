/**
 * The matmul kernels the kernel tests force, as one list: every `MatmulVariant`, and the `gemv`
 * kernels the kernel tuning may choose per call-site shape: `gemv4`, 4 weight rows per invocation
 * (`MatmulEncodeOptions.gemvRows`), `gemv8` and `gemv4x8`, steps of 8 weights per invocation
 * (`MatmulEncodeOptions.gemvStep`), `gemv4t32` and `gemv8t32`, 32 invocations per row instead of
 * 64 (`MatmulEncodeOptions.gemvTpr`); for int8 / int4 weights also `gemv32` and `gemv4x32`, steps
 * of a whole group.
 *
 * @module
 */

import type { MatmulEncodeOptions, MatmulVariant } from "../../kernels/matmul.ts";

/** A forced kernel of a test: a matmul variant, or one of the tuned `gemv` kernels. */
export type TestVariant =
  | MatmulVariant
  | "gemv4"
  | "gemv8"
  | "gemv4x8"
  | "gemv4t32"
  | "gemv8t32"
  | "gemv32"
  | "gemv4x32";

/** Every kernel the tests force. */
export const TEST_VARIANTS: readonly TestVariant[] = [
  "tiled",
  "gemv",
  "gemv4",
  "gemv8",
  "gemv4x8",
  "gemv4t32",
  "gemv8t32",
  "blocked",
  "unrolled",
];

/**
 * Every kernel the tests force on int8 / int4 weights: {@linkcode TEST_VARIANTS} and the `gemv`
 * kernels with steps of a whole group of 32 (`gemv32`, `gemv4x32`: 1 and 4 weight rows per
 * invocation), which read quantized weights only.
 */
export const QUANT_TEST_VARIANTS: readonly TestVariant[] = [
  ...TEST_VARIANTS,
  "gemv32",
  "gemv4x32",
];

/** The encode options that force `variant` (undefined: the policy's choice). */
export function forced(variant: TestVariant | undefined): MatmulEncodeOptions {
  switch (variant) {
    case "gemv4":
      return { variant: "gemv", gemvRows: 4 };
    case "gemv8":
      return { variant: "gemv", gemvStep: 8 };
    case "gemv4x8":
      return { variant: "gemv", gemvRows: 4, gemvStep: 8 };
    case "gemv4t32":
      return { variant: "gemv", gemvRows: 4, gemvTpr: 32 };
    case "gemv8t32":
      return { variant: "gemv", gemvStep: 8, gemvTpr: 32 };
    case "gemv32":
      return { variant: "gemv", gemvStep: 32 };
    case "gemv4x32":
      return { variant: "gemv", gemvRows: 4, gemvStep: 32 };
    case undefined:
      return {};
    default:
      return { variant };
  }
}

/** The weight padding `variant` needs: kernels reading 8-element steps need a row stride of 8s. */
export function padColsFor(variant: TestVariant | undefined): number {
  return variant === "unrolled" || variant === "gemv8" || variant === "gemv4x8" ||
      variant === "gemv8t32" || variant === "gemv32" || variant === "gemv4x32"
    ? 8
    : 4;
}
