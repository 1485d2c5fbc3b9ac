import { deepStrictEqual as assertEquals, ok } from "node:assert/strict";
import { expandRowScans, logitRowSource } from "../kernels/logit_row.ts";

Deno.test(
  "expandRowScans() replaces a ROW_SCAN line by the 4-in-flight row loop and keeps the rest",
  () => {
    const source = ["fn f() {", "  ROW_SCAN(visit($logit, $index, 3u));", "  done();", "}"];
    assertEquals(expandRowScans(source.join("\n")).split("\n"), [
      "fn f() {",
      "  {",
      "    var scan_i = lid;",
      "    for (; scan_i + 3u * WG < vocab; scan_i += 4u * WG) {",
      "      let scan_l0 = logits[base + scan_i];",
      "      let scan_l1 = logits[base + scan_i + WG];",
      "      let scan_l2 = logits[base + scan_i + 2u * WG];",
      "      let scan_l3 = logits[base + scan_i + 3u * WG];",
      "      visit(scan_l0, scan_i, 3u);",
      "      visit(scan_l1, scan_i + WG, 3u);",
      "      visit(scan_l2, scan_i + 2u * WG, 3u);",
      "      visit(scan_l3, scan_i + 3u * WG, 3u);",
      "    }",
      "    for (; scan_i < vocab; scan_i += WG) {",
      "      visit(logits[base + scan_i], scan_i, 3u);",
      "    }",
      "  }",
      "  done();",
      "}",
    ]);
  },
);

Deno.test("logitRowSource() prepends the shared helpers and leaves no ROW_SCAN marker", () => {
  const code = logitRowSource("fn g() {\n  ROW_SCAN(a($logit));\n  ROW_SCAN(b($index));\n}\n");
  ok(code.indexOf("fn order_key(") < code.indexOf("fn g()"), "prelude first");
  ok(code.includes("fn mix32(") && code.includes("const NEG_INF"), "helpers present");
  ok(!/^\s*ROW_SCAN\(/m.test(code) && !code.includes("$logit") && !code.includes("$index"), code);
  ok(code.includes("a(scan_l3);") && code.includes("b(scan_i + 2u * WG);"), code);
});
