/**
 * vLLM's `serve` arguments on `main.ts serve` (cli/vllm_flags.ts) and the `--dtype` /
 * `--chat-template` engine flags (cli/engine_flags.ts): what each means here, the one-line
 * refusals of what this server cannot do, and a vLLM-style command line end to end.
 *
 * @module
 */

import assert from "node:assert/strict";
import { parseDtype, parseKvCacheDtype, readChatTemplate } from "../cli/engine_flags.ts";
import { UsageError } from "../cli/usage.ts";
import { normalizeVllmArgs, vllmServeFlagValues } from "../cli/vllm_flags.ts";
import { makeModel } from "../tools/make_model.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { MAIN, startServe, stopServe } from "./support/serve_process.ts";

Deno.test("vllmServeFlagValues() reads a positional model and --seed as --model and --engine-seed", () => {
  assert.deepEqual(vllmServeFlagValues({}, []), {});
  assert.deepEqual(vllmServeFlagValues({}, ["Qwen/Qwen3-0.6B"]), { model: "Qwen/Qwen3-0.6B" });
  assert.deepEqual(vllmServeFlagValues({ model: "/m" }, ["/m"]), { model: "/m" });
  assert.deepEqual(vllmServeFlagValues({ seed: "3" }, []), { "engine-seed": "3" });
  assert.deepEqual(vllmServeFlagValues({ seed: "3", "engine-seed": "3" }, []), {
    "engine-seed": "3",
  });
  assert.deepEqual(vllmServeFlagValues({ "no-enable-prefix-caching": true }, []), {
    "no-prefix-caching": true,
  });
  assert.deepEqual(vllmServeFlagValues({ "no-enable-chunked-prefill": true }, []), {
    "no-chunked-prefill": true,
  });
  assert.deepEqual(
    vllmServeFlagValues({
      "enable-prefix-caching": true,
      "enable-chunked-prefill": true,
      "disable-log-requests": true,
      "disable-log-stats": true,
      "tensor-parallel-size": "1",
      "pipeline-parallel-size": "1",
      "enforce-eager": true,
      "trust-remote-code": true,
      "enable-auto-tool-choice": true,
      "tool-call-parser": "hermes",
    }, []),
    {},
  );
});

Deno.test("vllmServeFlagValues() refuses what the server cannot do in one line", () => {
  const cases: [Parameters<typeof vllmServeFlagValues>, RegExp][] = [
    [[{}, ["/a", "/b"]], /^Unexpected arguments '\/b': serve takes one model/],
    [[{ model: "/b" }, ["/a"]], /^Two models given: '\/a' and --model \/b$/],
    [[{ seed: "1", "engine-seed": "2" }, []], /^--seed 1 contradicts --engine-seed 2$/],
    [[{ "tensor-parallel-size": "2" }, []], /^--tensor-parallel-size 2: .*one GPU.*cluster/],
    [
      [{ "enable-prefix-caching": true, "no-enable-prefix-caching": true }, []],
      /^--enable-prefix-caching contradicts --no-enable-prefix-caching$/,
    ],
    [
      [{ "enable-chunked-prefill": true, "no-chunked-prefill": true }, []],
      /^--enable-chunked-prefill contradicts --no-chunked-prefill$/,
    ],
    [[{ "pipeline-parallel-size": "4" }, []], /^--pipeline-parallel-size 4: /],
    [[{ "tool-call-parser": "mistral" }, []], /^--tool-call-parser mistral: .*hermes/],
  ];
  for (const [args, message] of cases) {
    assert.throws(
      () => vllmServeFlagValues(...args),
      (e) => e instanceof UsageError && message.test(e.message) && !e.message.includes("\n"),
      JSON.stringify(args),
    );
  }
});

Deno.test("normalizeVllmArgs() takes vLLM's names after --served-model-name and spells out -tp / -pp", () => {
  assert.deepEqual(
    normalizeVllmArgs(["m", "--served-model-name", "a", "b", "c", "--port", "1"]),
    {
      args: ["m", "--served-model-name", "a", "--port", "1"],
      moreNames: ["b", "c"],
    },
  );
  assert.deepEqual(normalizeVllmArgs(["--served-model-name=a", "b", "-x"]), {
    args: ["--served-model-name=a", "-x"],
    moreNames: ["b"],
  });
  assert.deepEqual(normalizeVllmArgs(["m", "--served-model-name", "a"]), {
    args: ["m", "--served-model-name", "a"],
    moreNames: [],
  });
  assert.deepEqual(normalizeVllmArgs(["m", "-tp", "1", "-pp", "1"]), {
    args: ["m", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1"],
    moreNames: [],
  });
  // Nothing after "--" is read.
  assert.deepEqual(normalizeVllmArgs(["--", "--served-model-name", "a", "b"]), {
    args: ["--", "--served-model-name", "a", "b"],
    moreNames: [],
  });
});

Deno.test("parseDtype() maps vLLM's dtype names and refuses bfloat16 saying why", () => {
  assert.equal(parseDtype("auto"), "auto");
  assert.equal(parseDtype("half"), "float16");
  assert.equal(parseDtype("float16"), "float16");
  assert.equal(parseDtype("float"), "float32");
  assert.equal(parseDtype("float32"), "float32");
  assert.throws(() => parseDtype("bfloat16"), /WGSL has no bfloat16 type/);
  assert.throws(() => parseDtype("fp8"), /--dtype expects one of auto, half, .*, got "fp8"/);
});

Deno.test("parseKvCacheDtype() maps vLLM's fp8 names to e4m3 and refuses the other formats", () => {
  assert.equal(parseKvCacheDtype("auto"), "auto");
  assert.equal(parseKvCacheDtype("fp8"), "fp8_e4m3");
  assert.equal(parseKvCacheDtype("fp8_e4m3"), "fp8_e4m3");
  for (const other of ["fp8_e5m2", "fp8_inc", "bfloat16"]) {
    assert.throws(
      () => parseKvCacheDtype(other),
      (e) =>
        e instanceof TypeError &&
        e.message.startsWith(
          `--kv-cache-dtype ${other}: the fp8 KV cache is e4m3 (fp8 or fp8_e4m3)`,
        ),
    );
  }
  assert.throws(() => parseKvCacheDtype("int8"), /expects one of auto, fp8, fp8_e4m3, got "int8"/);
});

Deno.test("readChatTemplate() reads a file, or takes a template given inline with its escapes", async () => {
  const dir = await Deno.makeTempDir({ prefix: "chat_tmpl_" });
  try {
    const file = `${dir}/t.jinja`;
    await Deno.writeTextFile(file, "{{ messages[0].content }}\\n{# a file's \\n stays #}\n");
    assert.equal(readChatTemplate(file), "{{ messages[0].content }}\\n{# a file's \\n stays #}\n");
    assert.equal(
      readChatTemplate(String.raw`{{ '<s>' }}\n{{ x }}\t\\n\'`),
      "{{ '<s>' }}\n{{ x }}\t\\n'",
    );
    assert.throws(
      () => readChatTemplate(`${dir}/missing.jinja`),
      (e) =>
        e instanceof TypeError &&
        e.message === `--chat-template: cannot read "${dir}/missing.jinja" (no such file); ` +
            "give a template file or the template itself",
    );
    assert.throws(
      () => readChatTemplate("{% for %}"),
      (e) =>
        e instanceof TypeError &&
        e.message.startsWith("--chat-template: Cannot parse the chat template:"),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("serve refuses a vLLM flag it cannot honour before it binds a port", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, "serve", "--port", "0", "--tensor-parallel-size", "2"],
    env: { XDG_RUNTIME_DIR: "/tmp" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 2, stderr);
  assert.doesNotMatch(new TextDecoder().decode(out.stdout), /Listening on/);
  assert.equal(stderr.trim().split("\n").length, 1, stderr);
  assert.match(stderr, /^error: --tensor-parallel-size 2: this server runs a model on one GPU/);
});

Deno.test(
  "serve runs a vLLM command line: the model first, vLLM's flags, --dtype, --chat-template, --generation-config",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir({ prefix: "vllm_cli_" });
    await makeModel({ out: dir, preset: "tiny-qwen3", seed: 3 });
    const template = `${dir}/plain.jinja`;
    await Deno.writeTextFile(
      template,
      "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}" +
        "{% if add_generation_prompt %}[assistant] {% endif %}",
    );
    const server = await startServe("", [
      dir,
      "--dtype",
      "float32",
      "--seed",
      "11",
      "-tp",
      "1",
      "--enforce-eager",
      "--trust-remote-code",
      "--no-enable-prefix-caching",
      "--kv-cache-dtype",
      "fp8",
      "--disable-log-requests",
      "--served-model-name",
      "qwen",
      "qwen-alias",
      "--enable-auto-tool-choice",
      "--tool-call-parser",
      "hermes",
      "--chat-template",
      template,
      "--generation-config",
      "vllm",
      "--override-generation-config",
      '{"top_k": 3}',
    ]);
    try {
      const log = server.log.join("\n");
      assert.match(log, /^Chat template: the one given \(--chat-template\)/m);
      assert.match(log, /^Adapter: .*; weights f32;/m);
      // tiny-qwen3: 3 layers x 2 kv heads x head_dim 32, K and V, a byte each.
      assert.match(log, /^KV cache dtype: fp8_e4m3, 384 bytes per token \(K and V of 3 layers\)$/m);
      assert.match(
        log,
        /^Sampling defaults: top_k 3 \(--generation-config vllm: none from the model, with top_k from --override-generation-config\)$/m,
      );
      const post = async (path: string, body: unknown) => {
        const r = await fetch(`${server.url}${path}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
        });
        assert.equal(r.status, 200, path);
        return await r.json();
      };
      const model = "qwen-alias";
      const models = await (await fetch(`${server.url}/v1/models`)).json();
      assert.deepEqual(models.data.map((m: { id: string }) => m.id), ["qwen", "qwen-alias"]);
      const { tokens } = await post("/tokenize", {
        model,
        messages: [{ role: "user", content: "hello there" }],
      });
      const { prompt } = await post("/detokenize", { model, tokens });
      assert.equal(prompt, "[user] hello there\n[assistant] ");
      // --no-enable-prefix-caching: the second of two equal 40-token prompts hits nothing.
      const ids = Array.from({ length: 40 }, (_, i) => (i * 7) % 300);
      for (let i = 0; i < 2; i++) {
        await post("/v1/completions", { model, prompt: ids, max_tokens: 1 });
      }
      const metrics = await (await fetch(`${server.url}/metrics`)).text();
      const hits = metrics.split("\n").find((l) => l.startsWith("vllm:prefix_cache_hits_total{"));
      assert.equal(Number(hits?.split(" ").at(-1)), 0, hits);
      assert.match(
        metrics,
        /^vllm:cache_config_info\{block_size="16",cache_dtype="fp8_e4m3",enable_prefix_caching="False",num_cpu_blocks="0",num_gpu_blocks="\d+"\} 1\.0$/m,
      );
    } finally {
      assert.equal((await stopServe(server)).code, 0, server.log.join("\n"));
      await Deno.remove(dir, { recursive: true });
    }
  },
);
