package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// manifestDir holds the manifests the test checks as shipped; failure cases check modified
// copies of it.
const manifestDir = "kubernetes"

// imageConfigDir is where the image reads its two files (the Dockerfile's entrypoint).
const imageConfigDir = "/etc/toron"

// toronBin is the gateway binary, built from the parent module, that checks the ConfigMap's files.
var toronBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toron-deploy")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	toronBin = filepath.Join(dir, "toron")
	build := exec.Command("go", "build", "-o", toronBin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build toron from the parent module: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// kustomization is the part of kustomize's Kustomization these manifests use; decoding it
// strictly refuses any other key, so a new one must be added here on purpose.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
		IncludeTemplates bool              `json:"includeTemplates,omitempty"`
	} `json:"labels,omitempty"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// manifests are the decoded objects of one directory, each with the file it came from.
type manifests struct {
	configMaps  []named[*corev1.ConfigMap]
	deployments []named[*appsv1.Deployment]
	services    []named[*corev1.Service]
	hpas        []named[*autoscalingv2.HorizontalPodAutoscaler]
	pdbs        []named[*policyv1.PodDisruptionBudget]
}

type named[T any] struct {
	file string
	obj  T
}

// effective is what `toron -check` says of the ConfigMap's files: the values the pod runs with.
type effective struct {
	Server struct {
		Port            int    `json:"port"`
		HealthPath      string `json:"health_path"`
		DrainDelay      string `json:"drain_delay"`
		ShutdownTimeout string `json:"shutdown_timeout"`
	} `json:"server"`
}

// problems collects what is wrong, one line each, naming the file and object.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// decodeStrict decodes one YAML document into obj, refusing unknown and duplicate fields
// (sigs.k8s.io/yaml converts to JSON and decodes with DisallowUnknownFields).
func decodeStrict(doc []byte, obj any) error { return yaml.UnmarshalStrict(doc, obj) }

// splitDocs splits a YAML stream on its "---" lines, dropping empty documents.
func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if bytes.Equal(bytes.TrimRight(line, "\r\n"), []byte("---")) {
			docs = append(docs, bytes.Clone(cur.Bytes()))
			cur.Reset()
			continue
		}
		cur.Write(line)
	}
	docs = append(docs, cur.Bytes())
	var out [][]byte
	for _, d := range docs {
		var probe map[string]any
		if yaml.Unmarshal(d, &probe) == nil && len(probe) > 0 {
			out = append(out, d)
		}
	}
	return out
}

// optionalManifests are applied on their own, never by the kustomization (redis.yaml: the Redis
// of the global rate limits, docs/rate-limits.md).
var optionalManifests = []string{"redis.yaml"}

// load reads the kustomization of dir and decodes every resource it lists strictly into its
// Kubernetes API type.
func load(dir string, p *problems) *manifests {
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		p.addf("kustomization.yaml: %v", err)
		return nil
	}
	var k kustomization
	if err := decodeStrict(b, &k); err != nil {
		p.addf("kustomization.yaml: %v", err)
		return nil
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		p.addf("kustomization.yaml: apiVersion/kind %s/%s, want kustomize.config.k8s.io/v1beta1 Kustomization", k.APIVersion, k.Kind)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !slices.Contains(optionalManifests, base) && !slices.Contains(k.Resources, base) {
			p.addf("kustomization.yaml: %s is not listed in resources", base)
		}
	}
	m := &manifests{}
	for _, res := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, res))
		if err != nil {
			p.addf("kustomization.yaml: resource %s: %v", res, err)
			continue
		}
		for i, doc := range splitDocs(b) {
			where := res
			if i > 0 {
				where = fmt.Sprintf("%s (document %d)", res, i+1)
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				p.addf("%s: %v", where, err)
				continue
			}
			var err error
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 ConfigMap":
				err = decodeInto(doc, where, &m.configMaps)
			case "apps/v1 Deployment":
				err = decodeInto(doc, where, &m.deployments)
			case "v1 Service":
				err = decodeInto(doc, where, &m.services)
			case "autoscaling/v2 HorizontalPodAutoscaler":
				err = decodeInto(doc, where, &m.hpas)
			case "policy/v1 PodDisruptionBudget":
				err = decodeInto(doc, where, &m.pdbs)
			default:
				err = fmt.Errorf("apiVersion %q kind %q: not one the check knows (autoscaling/v2 for the HPA, policy/v1 for the PDB)", tm.APIVersion, tm.Kind)
			}
			if err != nil {
				p.addf("%s: %v", where, err)
			}
		}
	}
	return m
}

// decodeInto decodes doc strictly as a T and appends it, named where, to list.
func decodeInto[T any](doc []byte, where string, list *[]named[*T]) error {
	o := new(T)
	if err := decodeStrict(doc, o); err != nil {
		return err
	}
	*list = append(*list, named[*T]{where, o})
	return nil
}

// one reports that exactly one object of a kind exists and returns it.
func one[T any](p *problems, kind string, list []named[T]) (named[T], bool) {
	if len(list) != 1 {
		p.addf("%d %s objects, want 1", len(list), kind)
		var zero named[T]
		return zero, false
	}
	return list[0], true
}

// checkConfig runs `toron -check` on the ConfigMap's two files, with the container's literal
// TORON_ environment on top, as the pod would, and returns the effective server settings.
func checkConfig(t *testing.T, cm named[*corev1.ConfigMap], env []corev1.EnvVar, p *problems) (*effective, bool) {
	t.Helper()
	dir := t.TempDir()
	for _, key := range []string{"config.yaml", "routes.yaml"} {
		v, ok := cm.obj.Data[key]
		if !ok {
			p.addf("%s: ConfigMap %s has no %s", cm.file, cm.obj.Name, key)
			return nil, false
		}
		if err := os.WriteFile(filepath.Join(dir, key), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(toronBin, "-check", "-config", filepath.Join(dir, "config.yaml"), "-routes", filepath.Join(dir, "routes.yaml"))
	cmd.Env = []string{}
	for _, e := range env {
		if strings.HasPrefix(e.Name, "TORON_") && e.ValueFrom == nil {
			cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		p.addf("%s: toron -check refuses the ConfigMap's files (%v): %s", cm.file, err, strings.TrimSpace(stderr.String()))
		return nil, false
	}
	var eff effective
	if err := json.Unmarshal(stdout.Bytes(), &eff); err != nil {
		t.Fatalf("toron -check output is not JSON: %v", err)
	}
	return &eff, true
}

// probeBudget is how long a probe tolerates failures before it acts, with Kubernetes' defaults
// (period 10 s, failure threshold 3).
func probeBudget(pr *corev1.Probe) time.Duration {
	period, threshold := pr.PeriodSeconds, pr.FailureThreshold
	if period == 0 {
		period = 10
	}
	if threshold == 0 {
		threshold = 3
	}
	return time.Duration(period*threshold) * time.Second
}

// resolvePort turns a probe's or a Service's target port (a number or a container port's name)
// into a number; 0 when a name matches no port of the container.
func resolvePort(port intstr.IntOrString, c corev1.Container) int {
	if port.Type == intstr.Int {
		return port.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == port.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return 0
}

// checkManifests checks the manifests of dir and returns every problem found.
func checkManifests(t *testing.T, dir string) problems {
	t.Helper()
	var p problems
	m := load(dir, &p)
	if m == nil {
		return p
	}
	dep, okD := one(&p, "Deployment", m.deployments)
	cm, okC := one(&p, "ConfigMap", m.configMaps)
	svc, okS := one(&p, "Service", m.services)
	hpa, okH := one(&p, "HorizontalPodAutoscaler", m.hpas)
	pdb, okP := one(&p, "PodDisruptionBudget", m.pdbs)
	if !okD {
		return p
	}
	d := dep.obj
	where := fmt.Sprintf("%s: Deployment %s", dep.file, d.Name)
	spec := d.Spec.Template.Spec
	podLabels := labels.Set(d.Spec.Template.Labels)

	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		p.addf("%s: replicas must be at least 2", where)
	}
	if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || sel.Empty() || !sel.Matches(podLabels) {
		p.addf("%s: spec.selector does not match the pod template's labels %v", where, podLabels)
	}
	if len(spec.Containers) != 1 {
		p.addf("%s: %d containers, want 1 (toron)", where, len(spec.Containers))
		return p
	}
	c := spec.Containers[0]

	// Runs as non-root, read-only.
	nonRoot := spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot
	if c.SecurityContext != nil && c.SecurityContext.RunAsNonRoot != nil {
		nonRoot = *c.SecurityContext.RunAsNonRoot
	}
	if !nonRoot {
		p.addf("%s: runAsNonRoot must be true", where)
	}
	for _, uid := range []*int64{ptrUID(spec.SecurityContext), ptrUIDc(c.SecurityContext)} {
		if uid != nil && *uid == 0 {
			p.addf("%s: runAsUser 0 is root", where)
		}
	}
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		p.addf("%s: container %s: readOnlyRootFilesystem must be true", where, c.Name)
	}

	// The image's entrypoint starts -watch on /etc/toron; a command that replaces it must too.
	if len(c.Command) > 0 && !slices.Contains(c.Command, "-watch") && !slices.Contains(c.Args, "-watch") {
		p.addf("%s: container %s: command %v replaces the image's entrypoint without -watch: ConfigMap updates would need a restart", where, c.Name, c.Command)
	}

	// Resources and GOMEMLIMIT.
	if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
		p.addf("%s: container %s: no CPU request (the HPA's utilization is a share of it)", where, c.Name)
	}
	if _, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok {
		p.addf("%s: container %s: no memory request", where, c.Name)
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		p.addf("%s: container %s: no memory limit (GOMEMLIMIT is derived from it)", where, c.Name)
	}
	gomem := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" })
	if gomem < 0 || c.Env[gomem].ValueFrom == nil || c.Env[gomem].ValueFrom.ResourceFieldRef == nil ||
		c.Env[gomem].ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
		p.addf("%s: container %s: GOMEMLIMIT must come from resourceFieldRef limits.memory", where, c.Name)
	}

	// The ConfigMap, mounted whole at the image's directory.
	for _, vm := range c.VolumeMounts {
		if vm.SubPath != "" || vm.SubPathExpr != "" {
			p.addf("%s: container %s: volume %s is mounted with subPath, which the kubelet never updates: mount the ConfigMap as a directory", where, c.Name, vm.Name)
		}
	}
	if okC {
		mounted := false
		for _, v := range spec.Volumes {
			if v.ConfigMap == nil || v.ConfigMap.Name != cm.obj.Name {
				continue
			}
			if len(v.ConfigMap.Items) > 0 {
				// Items are fine, but both files must be there under their own names.
				for _, key := range []string{"config.yaml", "routes.yaml"} {
					if !slices.ContainsFunc(v.ConfigMap.Items, func(k corev1.KeyToPath) bool { return k.Key == key && k.Path == key }) {
						p.addf("%s: volume %s: items leave out %s", where, v.Name, key)
					}
				}
			}
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name && filepath.Clean(vm.MountPath) == imageConfigDir && vm.SubPath == "" && vm.SubPathExpr == "" {
					mounted = true
				}
			}
		}
		if !mounted {
			p.addf("%s: container %s: ConfigMap %s is not mounted as a directory at %s", where, c.Name, cm.obj.Name, imageConfigDir)
		}
	}

	// Probes and the grace period, against the configuration the pod runs with.
	var eff *effective
	if okC {
		eff, okC = checkConfig(t, cm, c.Env, &p)
	}
	if okC {
		port, health := eff.Server.Port, eff.Server.HealthPath
		drain, err1 := time.ParseDuration(eff.Server.DrainDelay)
		shutdown, err2 := time.ParseDuration(eff.Server.ShutdownTimeout)
		if err1 != nil || err2 != nil {
			t.Fatalf("toron -check durations: %v %v", err1, err2)
		}
		if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return int(cp.ContainerPort) == port }) {
			p.addf("%s: container %s: no containerPort %d (server.port of the ConfigMap)", where, c.Name, port)
		}
		checkHTTP := func(name string, pr *corev1.Probe) {
			if pr.HTTPGet == nil {
				p.addf("%s: %s must be an httpGet of %s", where, name, health)
				return
			}
			if pr.HTTPGet.Path != health {
				p.addf("%s: %s path %q, but the ConfigMap's health_path is %q", where, name, pr.HTTPGet.Path, health)
			}
			if got := resolvePort(pr.HTTPGet.Port, c); got != port {
				p.addf("%s: %s port %s is %d, but the ConfigMap's server.port is %d", where, name, pr.HTTPGet.Port.String(), got, port)
			}
		}
		if c.ReadinessProbe == nil {
			p.addf("%s: no readinessProbe (it takes a draining pod out of the Service)", where)
		} else {
			checkHTTP("readinessProbe", c.ReadinessProbe)
		}
		switch lp := c.LivenessProbe; {
		case lp == nil:
			p.addf("%s: no livenessProbe", where)
		case lp.TCPSocket != nil:
			// The port stays open through drain_delay and closes for up to shutdown_timeout.
			if got := resolvePort(lp.TCPSocket.Port, c); got != port {
				p.addf("%s: livenessProbe tcpSocket port %d, but the ConfigMap's server.port is %d", where, got, port)
			}
			if probeBudget(lp) <= shutdown {
				p.addf("%s: livenessProbe gives up after %s, within shutdown_timeout %s: it would kill a draining pod", where, probeBudget(lp), shutdown)
			}
		default:
			checkHTTP("livenessProbe", lp)
			// /health is 503 for drain_delay, then the port closes for up to shutdown_timeout.
			if probeBudget(lp) <= drain+shutdown {
				p.addf("%s: livenessProbe gives up after %s (periodSeconds x failureThreshold), within drain_delay + shutdown_timeout %s: it would kill a draining pod", where, probeBudget(lp), drain+shutdown)
			}
		}
		need := drain + shutdown + 5*time.Second
		grace := 30 * time.Second // Kubernetes' default
		if spec.TerminationGracePeriodSeconds != nil {
			grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
		}
		if grace < need {
			p.addf("%s: terminationGracePeriodSeconds %s is shorter than drain_delay %s + shutdown_timeout %s + 5s", where, grace, drain, shutdown)
		}
		if okS {
			for _, sp := range svc.obj.Spec.Ports {
				if got := resolvePort(sp.TargetPort, c); got != port {
					p.addf("%s: Service %s port %s targets %d, but the ConfigMap's server.port is %d", svc.file, svc.obj.Name, sp.Name, got, port)
				}
			}
		}
	}

	if okS {
		s := svc.obj
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			p.addf("%s: Service %s: selector %v does not select the Deployment's pods %v", svc.file, s.Name, s.Spec.Selector, podLabels)
		}
		if len(s.Spec.Ports) == 0 {
			p.addf("%s: Service %s has no ports", svc.file, s.Name)
		}
	}
	if okH {
		h := hpa.obj
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.Name != d.Name || ref.APIVersion != "apps/v1" {
			p.addf("%s: HorizontalPodAutoscaler %s targets %s %s %s, not the Deployment %s", hpa.file, h.Name, ref.APIVersion, ref.Kind, ref.Name, d.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 {
			p.addf("%s: HorizontalPodAutoscaler %s: minReplicas must be at least 2", hpa.file, h.Name)
		}
		if h.Spec.MinReplicas != nil && h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			p.addf("%s: HorizontalPodAutoscaler %s: maxReplicas below minReplicas", hpa.file, h.Name)
		}
		if !slices.ContainsFunc(h.Spec.Metrics, func(ms autoscalingv2.MetricSpec) bool {
			return ms.Type == autoscalingv2.ResourceMetricSourceType && ms.Resource != nil && ms.Resource.Name == corev1.ResourceCPU
		}) {
			p.addf("%s: HorizontalPodAutoscaler %s does not scale on CPU", hpa.file, h.Name)
		}
	}
	if okP {
		b := pdb.obj
		if sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector); err != nil || sel.Empty() || !sel.Matches(podLabels) {
			p.addf("%s: PodDisruptionBudget %s: selector does not select the Deployment's pods %v", pdb.file, b.Name, podLabels)
		}
		switch {
		case b.Spec.MinAvailable == nil && b.Spec.MaxUnavailable == nil:
			p.addf("%s: PodDisruptionBudget %s sets neither minAvailable nor maxUnavailable", pdb.file, b.Name)
		case b.Spec.MinAvailable != nil && b.Spec.MinAvailable.Type == intstr.Int && d.Spec.Replicas != nil && b.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas):
			p.addf("%s: PodDisruptionBudget %s: minAvailable %d of %d replicas blocks every eviction (node drains never finish)", pdb.file, b.Name, b.Spec.MinAvailable.IntValue(), *d.Spec.Replicas)
		case b.Spec.MaxUnavailable != nil && b.Spec.MaxUnavailable.Type == intstr.Int && b.Spec.MaxUnavailable.IntValue() < 1:
			p.addf("%s: PodDisruptionBudget %s: maxUnavailable 0 blocks every eviction", pdb.file, b.Name)
		}
	}
	return p
}

func ptrUID(sc *corev1.PodSecurityContext) *int64 {
	if sc == nil {
		return nil
	}
	return sc.RunAsUser
}

func ptrUIDc(sc *corev1.SecurityContext) *int64 {
	if sc == nil {
		return nil
	}
	return sc.RunAsUser
}

// TestManifests: the shipped manifests decode strictly and hold every invariant.
func TestManifests(t *testing.T) {
	if p := checkManifests(t, manifestDir); len(p) > 0 {
		t.Errorf("deploy/kubernetes:\n  %s", strings.Join(p, "\n  "))
	}
}

// TestManifestsFailures: each mistake, made on a copy of the manifests, is reported.
func TestManifestsFailures(t *testing.T) {
	cases := []struct {
		name, file, old, new string
		want                 string // in one of the problems
	}{
		{"subPath mount", "deployment.yaml",
			"              mountPath: /etc/toron\n",
			"              mountPath: /etc/toron/config.yaml\n              subPath: config.yaml\n",
			"subPath"},
		{"grace period too short", "deployment.yaml",
			"terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30",
			"terminationGracePeriodSeconds 30s is shorter"},
		{"drain_delay raised in the ConfigMap alone", "configmap.yaml",
			"drain_delay: 10s", "drain_delay: 20s",
			"terminationGracePeriodSeconds 45s is shorter"},
		{"wrong readiness path", "deployment.yaml",
			"          readinessProbe:\n            httpGet:\n              path: /health\n",
			"          readinessProbe:\n            httpGet:\n              path: /healthz\n",
			`readinessProbe path "/healthz"`},
		{"wrong liveness port", "deployment.yaml",
			"          livenessProbe:\n            httpGet:\n              path: /health\n              port: http\n",
			"          livenessProbe:\n            httpGet:\n              path: /health\n              port: 9090\n",
			"livenessProbe port 9090"},
		{"server.port moved in the ConfigMap", "configmap.yaml",
			"port: 8080", "port: 9000",
			"no containerPort 9000"},
		{"liveness kills a draining pod", "deployment.yaml",
			"failureThreshold: 6", "failureThreshold: 3",
			"would kill a draining pod"},
		{"unknown field", "deployment.yaml",
			"          readinessProbe:\n", "          readinesProbe:\n",
			`unknown field "readinesProbe"`},
		{"one replica", "deployment.yaml",
			"replicas: 2", "replicas: 1",
			"replicas must be at least 2"},
		{"runAsNonRoot off", "deployment.yaml",
			"runAsNonRoot: true", "runAsNonRoot: false",
			"runAsNonRoot must be true"},
		{"Service selects nothing", "service.yaml",
			"  selector:\n    app.kubernetes.io/name: toron\n", "  selector:\n    app.kubernetes.io/name: toron-gateway\n",
			"does not select the Deployment's pods"},
		{"PDB selects nothing", "pdb.yaml",
			"      app.kubernetes.io/name: toron\n", "      app.kubernetes.io/name: other\n",
			"PodDisruptionBudget toron: selector does not select"},
		{"HPA targets another Deployment", "hpa.yaml",
			"    name: toron\n", "    name: toron-old\n",
			"not the Deployment toron"},
		{"HPA on autoscaling/v1", "hpa.yaml",
			"apiVersion: autoscaling/v2", "apiVersion: autoscaling/v1",
			`apiVersion "autoscaling/v1"`},
		{"invalid route in the ConfigMap", "configmap.yaml",
			"target: http://api.default.svc.cluster.local:8080", "target: http://api.default.svc.cluster.local:8080/v1",
			"toron -check refuses"},
		{"command without -watch", "deployment.yaml",
			"          image: toron\n", "          image: toron\n          command: [/usr/local/bin/toron, -config, /etc/toron/config.yaml]\n",
			"without -watch"},
		{"manifest not listed", "kustomization.yaml",
			"  - pdb.yaml\n", "",
			"pdb.yaml is not listed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if filepath.Base(f) == tc.file {
					if !bytes.Contains(b, []byte(tc.old)) {
						t.Fatalf("%s does not contain %q: the case no longer applies", tc.file, tc.old)
					}
					b = bytes.Replace(b, []byte(tc.old), []byte(tc.new), 1)
				}
				if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			p := checkManifests(t, dir)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("no problem mentions %q; got:\n  %s", tc.want, strings.Join(p, "\n  "))
			}
		})
	}
}

// checkRedisManifest checks redis.yaml: strict decoding, one Deployment and its Service, the
// Service selecting the pods on port 6379, no persistence, and not started by the kustomization.
func checkRedisManifest(dir string) problems {
	var p problems
	b, err := os.ReadFile(filepath.Join(dir, "redis.yaml"))
	if err != nil {
		p.addf("redis.yaml: %v", err)
		return p
	}
	var dep *appsv1.Deployment
	var svc *corev1.Service
	for i, doc := range splitDocs(b) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			p.addf("redis.yaml (document %d): %v", i+1, err)
			continue
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			dep = &appsv1.Deployment{}
			if err := decodeStrict(doc, dep); err != nil {
				p.addf("redis.yaml (document %d): %v", i+1, err)
				dep = nil
			}
		case "v1 Service":
			svc = &corev1.Service{}
			if err := decodeStrict(doc, svc); err != nil {
				p.addf("redis.yaml (document %d): %v", i+1, err)
				svc = nil
			}
		default:
			p.addf("redis.yaml (document %d): apiVersion %q kind %q, want a Deployment and a Service", i+1, tm.APIVersion, tm.Kind)
		}
	}
	if dep == nil || svc == nil {
		p.addf("redis.yaml: want one Deployment and one Service")
		return p
	}
	pods := labels.Set(dep.Spec.Template.Labels)
	if sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector); err != nil || !sel.Matches(pods) {
		p.addf("redis.yaml: Deployment %s: selector does not select its own pods", dep.Name)
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(pods) {
		p.addf("redis.yaml: Service %s does not select the Redis pods", svc.Name)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 6379 {
		p.addf("redis.yaml: Service %s must expose port 6379", svc.Name)
	}
	if c := dep.Spec.Template.Spec.Containers; len(c) != 1 || len(c[0].Ports) != 1 || c[0].Ports[0].ContainerPort != 6379 ||
		svc.Spec.Ports[0].TargetPort.String() != c[0].Ports[0].Name {
		p.addf("redis.yaml: the Service's targetPort must name the container's port 6379")
	} else if args := strings.Join(c[0].Args, " "); !strings.Contains(args, "--appendonly no") || !strings.Contains(args, `--save `) {
		p.addf("redis.yaml: the container must run without persistence (--save \"\" --appendonly no), args %q", args)
	}
	if k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml")); err == nil && bytes.Contains(k, []byte("redis.yaml")) {
		p.addf("kustomization.yaml lists redis.yaml: the Redis must not start by default")
	}
	return p
}

// TestRedisManifest: the optional Redis decodes strictly and is wired to itself; a mistake made
// on a copy is reported.
func TestRedisManifest(t *testing.T) {
	if p := checkRedisManifest(manifestDir); len(p) > 0 {
		t.Errorf("deploy/kubernetes/redis.yaml:\n  %s", strings.Join(p, "\n  "))
	}
	orig, err := os.ReadFile(filepath.Join(manifestDir, "redis.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kust, err := os.ReadFile(filepath.Join(manifestDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, file, old, new, want string }{
		{"unknown field", "redis.yaml", "          readinessProbe:\n", "          readinesProbe:\n", `unknown field "readinesProbe"`},
		{"Service selects nothing", "redis.yaml", "  selector:\n    app.kubernetes.io/name: toron-redis\n", "  selector:\n    app.kubernetes.io/name: redis\n", "does not select the Redis pods"},
		{"persistence on", "redis.yaml", `"--appendonly", "no"`, `"--appendonly", "yes"`, "without persistence"},
		{"started by default", "kustomization.yaml", "  - pdb.yaml\n", "  - pdb.yaml\n  - redis.yaml\n", "must not start by default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			files := map[string][]byte{"redis.yaml": orig, "kustomization.yaml": kust}
			if !bytes.Contains(files[tc.file], []byte(tc.old)) {
				t.Fatalf("%s does not contain %q: the case no longer applies", tc.file, tc.old)
			}
			files[tc.file] = bytes.Replace(files[tc.file], []byte(tc.old), []byte(tc.new), 1)
			for name, b := range files {
				if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			p := checkRedisManifest(dir)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("no problem mentions %q; got:\n  %s", tc.want, strings.Join(p, "\n  "))
			}
		})
	}
}
