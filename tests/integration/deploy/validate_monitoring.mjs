// Validates ServiceMonitor and PrometheusRule objects (a JSON list on stdin) against the
// Prometheus Operator's schemas, as @kubernetes-models/prometheus-operator compiles them
// from the operator's CRDs. Prints one line per object: "ok KIND NAME" or
// "invalid KIND NAME: what".
import { readFileSync } from "node:fs";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const kinds = { ServiceMonitor, PrometheusRule };
for (const doc of JSON.parse(readFileSync(0, "utf8"))) {
  const Kind = kinds[doc.kind];
  const name = `${doc.kind} ${doc.metadata.name}`;
  if (!Kind) {
    console.log(`invalid ${name}: not a kind this script knows`);
    continue;
  }
  try {
    new Kind(doc).validate();
    console.log(`ok ${name}`);
  } catch (err) {
    console.log(`invalid ${name}: ${err.message}`);
  }
}
