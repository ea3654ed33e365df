// Package deploy holds the offline check of the Kubernetes manifests in deploy/kubernetes
// (SPEC 18): a nested module, so that the gateway's go.mod does not carry the Kubernetes API
// modules. `make test` runs it after the main suite: cd deploy && go test -race ./...
package deploy
