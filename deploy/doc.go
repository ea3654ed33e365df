// Package deploy holds the offline checks of what deploy/ ships: the Kubernetes manifests in
// deploy/kubernetes (SPEC 18), the Grafana dashboard in deploy/grafana and the Prometheus alerts
// in deploy/prometheus (SPEC 21). A nested module, so that the gateway's go.mod carries neither
// the Kubernetes API modules nor Prometheus's PromQL parser. `make test` runs it after the main
// suite: cd deploy && go test -race ./...
package deploy
