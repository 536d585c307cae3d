// Validates prometheus-operator objects (PrometheusRule, ServiceMonitor) against the schemas of
// @kubernetes-models/prometheus-operator (npm, `make tools`), which are generated from
// prometheus-operator's API types (github.com/prometheus-operator/prometheus-operator,
// pkg/apis/monitoring/v1), the types its CRDs' OpenAPI schemas are generated from.
//
// Usage: node validate_crds.mjs MODELS_DIR < objects.json   (a JSON array of objects)
// Prints one line per problem, "<kind>/<name>: <message>", and exits 1 when there is any.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const models = process.argv[2];
const objects = JSON.parse(readFileSync(0, "utf8"));
const problems = [];
for (const o of objects) {
  const file = join(models, "monitoring.coreos.com", "v1", `${o.kind}.js`);
  let Model;
  try {
    Model = (await import(pathToFileURL(file).href))[o.kind];
  } catch (e) {
    problems.push(`${o.kind}/${o.metadata?.name}: no model for this kind (${e.message})`);
    continue;
  }
  try {
    new Model(o).validate();
  } catch (e) {
    problems.push(`${o.kind}/${o.metadata?.name}: ${e.message}`);
  }
}
for (const p of problems) console.log(p);
process.exit(problems.length ? 1 : 0);
