// Package kubernetes holds no code: its test decodes the Kubernetes
// manifests in this directory strictly into the k8s.io/api types and
// checks what the deployment relies on (three console replicas, probes on
// /readyz and /healthz, secrets only by reference, the disruption budget
// and the Service selecting the console's pods, annotated metrics). The
// k8s.io modules are imported by the test only, so no binary links them.
package kubernetes
