import { deepStrictEqual as assertEquals, throws as assertThrows } from "node:assert/strict";
import { unrollTemplate } from "../kernels/unroll.ts";

Deno.test("unrollTemplate() repeats marked lines, i outer, and leaves the others alone", () => {
  const source = [
    "let a = 1;",
    "var acc$i_$r = 0.0;",
    "let w$r = load(row + $ru);",
    "let x$i = xs[$i];",
    "}",
  ].join("\n");
  assertEquals(unrollTemplate(source, { i: 2, r: 3 }).split("\n"), [
    "let a = 1;",
    "var acc0_0 = 0.0;",
    "var acc0_1 = 0.0;",
    "var acc0_2 = 0.0;",
    "var acc1_0 = 0.0;",
    "var acc1_1 = 0.0;",
    "var acc1_2 = 0.0;",
    "let w0 = load(row + 0u);",
    "let w1 = load(row + 1u);",
    "let w2 = load(row + 2u);",
    "let x0 = xs[0];",
    "let x1 = xs[1];",
    "}",
  ]);
});

Deno.test("unrollTemplate() repeats $c lines per c, innermost, once when c is not given", () => {
  const source = ["let b$c = ws[$cu];", "acc$r_$c += a$r * b$c;", "y = acc0_$c;"].join("\n");
  assertEquals(unrollTemplate(source, { i: 1, r: 2, c: 2 }).split("\n"), [
    "let b0 = ws[0u];",
    "let b1 = ws[1u];",
    "acc0_0 += a0 * b0;",
    "acc0_1 += a0 * b1;",
    "acc1_0 += a1 * b0;",
    "acc1_1 += a1 * b1;",
    "y = acc0_0;",
    "y = acc0_1;",
  ]);
  assertEquals(unrollTemplate("let b$c = 1;", { i: 3, r: 3 }), "let b0 = 1;");
});

Deno.test("unrollTemplate() repeats $w lines per w, innermost, once when w is not given", () => {
  const source = ["let v$w = load($wu);", "put$i_$w(v$w, $cu);"].join("\n");
  assertEquals(unrollTemplate(source, { i: 2, r: 1, c: 2, w: 2 }).split("\n"), [
    "let v0 = load(0u);",
    "let v1 = load(1u);",
    "put0_0(v0, 0u);",
    "put0_1(v1, 0u);",
    "put0_0(v0, 1u);",
    "put0_1(v1, 1u);",
    "put1_0(v0, 0u);",
    "put1_1(v1, 0u);",
    "put1_0(v0, 1u);",
    "put1_1(v1, 1u);",
  ]);
  assertEquals(unrollTemplate("let v$w = 1;", { i: 3, r: 3 }), "let v0 = 1;");
});

Deno.test("unrollTemplate() rejects counts that are not positive integers", () => {
  assertThrows(() => unrollTemplate("x$i", { i: 0, r: 1 }), RangeError);
  assertThrows(() => unrollTemplate("x$r", { i: 1, r: 1.5 }), RangeError);
  assertThrows(() => unrollTemplate("x$c", { i: 1, r: 1, c: 0 }), RangeError);
  assertThrows(() => unrollTemplate("x$w", { i: 1, r: 1, w: -1 }), RangeError);
});
