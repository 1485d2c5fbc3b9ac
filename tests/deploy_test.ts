/**
 * The deployment examples in deploy/ stay valid and agree with the code: every Kubernetes
 * manifest passes the Kubernetes OpenAPI schema (kubernetes-models' validators, a linter of
 * kubeconform's kind), the Deployment's arguments are flags `serve` accepts, its probes and the
 * Service use the server's port and `/health`, the autoscaler's metric is one the server exports,
 * and the Prometheus example scrapes the ports and paths of deploy/nginx.conf.
 */

import assert from "node:assert/strict";
import { parse as parseYaml, parseAllDocuments } from "yaml";
import { Deployment } from "kubernetes-models/apps/v1/Deployment";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler";
import { Ingress } from "kubernetes-models/networking.k8s.io/v1/Ingress";
import { Service } from "kubernetes-models/v1/Service";
import { ENGINE_FLAGS } from "../cli/engine_flags.ts";
import { SERVE_FLAGS, serveSettingsFromFlags } from "../cli/serve_flags.ts";
import { parseCommandArgs } from "../cli/usage.ts";

const DEPLOY = new URL("../deploy/", import.meta.url).pathname;

// deno-lint-ignore no-explicit-any
type Manifest = any;

const VALIDATORS: Record<string, (doc: Manifest) => { validate(): void }> = {
  "apps/v1/Deployment": (d) => new Deployment(d),
  "v1/Service": (d) => new Service(d),
  "networking.k8s.io/v1/Ingress": (d) => new Ingress(d),
  "autoscaling/v2/HorizontalPodAutoscaler": (d) => new HorizontalPodAutoscaler(d),
};

async function manifests(): Promise<Manifest[]> {
  const docs: Manifest[] = [];
  for await (const entry of Deno.readDir(`${DEPLOY}kubernetes`)) {
    if (!entry.name.endsWith(".yaml")) continue;
    const text = await Deno.readTextFile(`${DEPLOY}kubernetes/${entry.name}`);
    for (const doc of parseAllDocuments(text)) {
      assert.equal(doc.errors.length, 0, `${entry.name}: ${doc.errors[0]?.message}`);
      docs.push({ file: entry.name, ...doc.toJS() });
    }
  }
  return docs;
}

Deno.test("every manifest in deploy/kubernetes passes the Kubernetes schema of its kind", async () => {
  const docs = await manifests();
  assert.deepEqual(
    docs.map((d) => `${d.apiVersion}/${d.kind}`).sort(),
    Object.keys(VALIDATORS).sort(),
  );
  for (const { file, ...doc } of docs) {
    const validator = VALIDATORS[`${doc.apiVersion}/${doc.kind}`]!;
    assert.doesNotThrow(() => validator(doc).validate(), file);
  }
  // The validators are not vacuous: a wrong type is refused.
  const deployment = docs.find((d) => d.kind === "Deployment")!;
  const broken = structuredClone(deployment);
  delete broken.file;
  broken.spec.template.spec.containers[0].ports[0].containerPort = "8000";
  assert.throws(() => new Deployment(broken).validate(), /containerPort/);
});

Deno.test("the Deployment runs serve with flags it accepts, probes /health on the served port; Service and HPA agree", async () => {
  const docs = await manifests();
  const deployment = docs.find((d) => d.kind === "Deployment")!;
  const container = deployment.spec.template.spec.containers[0];
  const [command, ...flags] = container.args as string[];
  assert.equal(command, "serve");
  const { values } = parseCommandArgs("serve", {
    args: flags,
    options: { ...ENGINE_FLAGS, ...SERVE_FLAGS },
  });
  const settings = serveSettingsFromFlags(values, () => undefined);
  assert.equal(settings.server.host, "0.0.0.0");
  const port = container.ports.find((p: Manifest) => p.name === "http").containerPort;
  assert.equal(settings.port, port);
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    assert.equal(container[probe].httpGet.path, "/health", probe);
    assert.equal(container[probe].httpGet.port, "http", probe);
  }
  assert.equal(container.resources.limits["nvidia.com/gpu"], 1);
  const service = docs.find((d) => d.kind === "Service")!;
  assert.equal(service.spec.ports[0].targetPort, "http");
  assert.deepEqual(service.spec.selector, deployment.spec.selector.matchLabels);
  const hpa = docs.find((d) => d.kind === "HorizontalPodAutoscaler")!;
  assert.equal(hpa.spec.scaleTargetRef.name, deployment.metadata.name);
  // The custom metrics API name of vllm:num_requests_waiting, which server/metrics.ts exports.
  const metricsSource = await Deno.readTextFile(new URL("../server/metrics.ts", import.meta.url));
  const name = hpa.spec.metrics[0].pods.metric.name as string;
  assert.ok(metricsSource.includes(`"${name.replace("vllm_", "vllm:")}"`), name);
});

Deno.test("deploy/prometheus.yml scrapes the replica ports and per-replica paths of deploy/nginx.conf", async () => {
  const nginx = await Deno.readTextFile(`${DEPLOY}nginx.conf`);
  const config = parseYaml(await Deno.readTextFile(`${DEPLOY}prometheus.yml`));
  const jobs = config.scrape_configs as Manifest[];
  const upstreams = [
    ...new Set([...nginx.matchAll(/^\s*server (\S+) max_fails/gm)].map((m) => m[1])),
  ];
  assert.deepEqual(jobs[0].static_configs[0].targets, upstreams);
  const paths = [...nginx.matchAll(/location = (\/replicas\/\d+\/metrics)/g)].map((m) => m[1]);
  assert.deepEqual(jobs.slice(1).map((j) => j.metrics_path), paths);
});
