package kubernetes

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse/gatehouse/internal/config"
)

// kustomization is the part of kustomize's Kustomization these manifests
// use; decoding is strict, so a field outside it fails the test.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Labels     []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
	Resources []string `json:"resources"`
	Images    []image  `json:"images"`
}

// image is a kustomize image override.
type image struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
}

// exampleSecrets is the file that shows the Secrets' shape and must never
// be applied by kustomize.
const exampleSecrets = "secret.example.yaml"

// manifests are the decoded objects.
type manifests struct {
	kust      kustomization
	console   *appsv1.Deployment
	service   *corev1.Service
	pdb       *policyv1.PodDisruptionBudget
	agentd    *appsv1.DaemonSet
	examples  []*corev1.Secret
	resources map[string]bool // files kustomize applies
}

// decodeStrict decodes one YAML document into obj, refusing unknown and
// duplicate fields.
func decodeStrict(doc []byte, obj any) error { return yaml.UnmarshalStrict(doc, obj) }

// documents splits a YAML stream at its "---" lines.
func documents(b []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

// load decodes every manifest of dir by its apiVersion and kind; a kind
// this test does not know fails, so nothing goes unchecked.
func load(dir string, read func(string) ([]byte, error)) (*manifests, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	m := &manifests{resources: map[string]bool{}}
	for _, f := range files {
		b, err := read(f)
		if err != nil {
			return nil, err
		}
		name := filepath.Base(f)
		for i, doc := range documents(b) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				return nil, fmt.Errorf("%s document %d: %w", name, i+1, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "kustomize.config.k8s.io/v1beta1 Kustomization":
				obj = &m.kust
			case "apps/v1 Deployment":
				m.console = &appsv1.Deployment{}
				obj = m.console
			case "apps/v1 DaemonSet":
				m.agentd = &appsv1.DaemonSet{}
				obj = m.agentd
			case "v1 Service":
				m.service = &corev1.Service{}
				obj = m.service
			case "policy/v1 PodDisruptionBudget":
				m.pdb = &policyv1.PodDisruptionBudget{}
				obj = m.pdb
			case "v1 Secret":
				if name != exampleSecrets {
					return nil, fmt.Errorf("%s holds a Secret: secrets are created with kubectl (see kustomization.yaml), never kept in the manifests", name)
				}
				s := &corev1.Secret{}
				m.examples = append(m.examples, s)
				obj = s
			default:
				return nil, fmt.Errorf("%s document %d: %q %q is not a kind this test checks", name, i+1, tm.APIVersion, tm.Kind)
			}
			if err := decodeStrict(doc, obj); err != nil {
				return nil, fmt.Errorf("%s document %d (%s): %w", name, i+1, tm.Kind, err)
			}
		}
	}
	for _, r := range m.kust.Resources {
		m.resources[r] = true
	}
	return m, nil
}

// The literal env values allowed: settings, never secrets.
var secretName = regexp.MustCompile(`(?i)(PASSWORD|TOKEN|SECRET|MASTER_KEY|API_KEY|DATABASE_URL|DSN)`)

// check lists every invariant the manifests break.
func check(m *manifests) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	// kustomization: every manifest applied, the example secret never.
	if m.kust.Kind != "Kustomization" {
		fail("kustomization.yaml is missing")
	}
	for _, want := range []string{"console-deployment.yaml", "console-service.yaml", "console-pdb.yaml", "agentd-daemonset.yaml"} {
		if !m.resources[want] {
			fail("kustomization.yaml does not list %s", want)
		}
	}
	if m.resources[exampleSecrets] {
		fail("kustomization.yaml lists %s: the example Secret with placeholder values would be applied", exampleSecrets)
	}
	if m.console == nil || m.service == nil || m.pdb == nil || m.agentd == nil {
		return append(errs, fmt.Errorf("a manifest is missing: Deployment %v, Service %v, PodDisruptionBudget %v, DaemonSet %v",
			m.console != nil, m.service != nil, m.pdb != nil, m.agentd != nil))
	}

	// The console Deployment.
	d := m.console
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		fail("console Deployment: replicas %v, want 3", ptrString(d.Spec.Replicas))
	}
	pods := labels.Set(d.Spec.Template.Labels)
	if !selects(d.Spec.Selector, pods) {
		fail("console Deployment: its selector does not select its own pod template")
	}
	c := container(d.Spec.Template.Spec, "console")
	if c == nil {
		return append(errs, fmt.Errorf("console Deployment: no container named console"))
	}
	httpPort, metricsPort := containerPort(c, "http"), containerPort(c, "metrics")
	cfg, err := consoleConfig(c)
	if err != nil {
		fail("console Deployment: the console does not accept its arguments %q: %v", c.Args, err)
	} else {
		if port(cfg.Listen) != httpPort || httpPort == 0 {
			fail("console Deployment: --listen %q does not serve the http container port %d", cfg.Listen, httpPort)
		}
		if cfg.MetricsListen == "" || port(cfg.MetricsListen) != metricsPort || metricsPort == 0 {
			fail("console Deployment: metrics are not served (--metrics-listen %q) on the metrics container port %d", cfg.MetricsListen, metricsPort)
		}
	}
	checkProbe(fail, "console readiness", c.ReadinessProbe, "/readyz", c, httpPort)
	checkProbe(fail, "console liveness", c.LivenessProbe, "/healthz", c, httpPort)
	for _, name := range []string{"DATABASE_URL", "GATEHOUSE_MASTER_KEY"} {
		if !fromSecret(c, name) {
			fail("console Deployment: %s does not come from a Secret (secretKeyRef or envFrom secretRef)", name)
		}
	}
	ann := d.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" {
		fail("console Deployment: pods are not annotated for scraping (prometheus.io/scrape %q, prometheus.io/path %q)", ann["prometheus.io/scrape"], ann["prometheus.io/path"])
	}
	if ann["prometheus.io/port"] != strconv.Itoa(int(metricsPort)) || metricsPort == 0 {
		fail("console Deployment: prometheus.io/port %q is not the metrics port %d", ann["prometheus.io/port"], metricsPort)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		fail("console Deployment: CPU and memory requests and a memory limit are required")
	}

	// Service and PodDisruptionBudget: the console's pods and no others.
	agentdPods := labels.Set(m.agentd.Spec.Template.Labels)
	svcSel := labels.SelectorFromSet(m.service.Spec.Selector)
	if len(m.service.Spec.Selector) == 0 || !svcSel.Matches(pods) || svcSel.Matches(agentdPods) {
		fail("Service: selector %v does not select exactly the console's pods", m.service.Spec.Selector)
	}
	for _, p := range m.service.Spec.Ports {
		if p.TargetPort != intstr.FromString("http") && p.TargetPort != intstr.FromInt32(httpPort) {
			fail("Service: port %s targets %s, not the console's http port", p.Name, p.TargetPort.String())
		}
		if p.TargetPort == intstr.FromString("metrics") || p.TargetPort == intstr.FromInt32(metricsPort) {
			fail("Service: exposes the metrics port")
		}
	}
	if len(m.service.Spec.Ports) == 0 {
		fail("Service: no port")
	}
	if !selects(m.pdb.Spec.Selector, pods) || selects(m.pdb.Spec.Selector, agentdPods) {
		fail("PodDisruptionBudget: its selector does not select exactly the console's pods")
	}
	if m.pdb.Spec.MaxUnavailable == nil && m.pdb.Spec.MinAvailable == nil {
		fail("PodDisruptionBudget: neither maxUnavailable nor minAvailable")
	}

	// agentd DaemonSet.
	a := container(m.agentd.Spec.Template.Spec, "agentd")
	if a == nil {
		return append(errs, fmt.Errorf("agentd DaemonSet: no container named agentd"))
	}
	if !selects(m.agentd.Spec.Selector, agentdPods) {
		fail("agentd DaemonSet: its selector does not select its own pod template")
	}
	if !slices.Equal(a.Command, []string{"/usr/local/bin/agentd"}) {
		fail("agentd DaemonSet: command %q, want the image's agentd", a.Command)
	}
	agentdPort := containerPort(a, "agentd")
	if listen := flagValue(a.Args, "listen"); port(listen) != agentdPort || agentdPort == 0 {
		fail("agentd DaemonSet: --listen %q is not the agentd container port %d", listen, agentdPort)
	}
	checkProbe(fail, "agentd readiness", a.ReadinessProbe, "/healthz", a, agentdPort)
	checkProbe(fail, "agentd liveness", a.LivenessProbe, "/healthz", a, agentdPort)
	if !fromSecret(a, "AGENTD_TOKEN") {
		fail("agentd DaemonSet: AGENTD_TOKEN does not come from a Secret")
	}

	// No container anywhere carries a secret as a literal value.
	for _, spec := range []corev1.PodSpec{d.Spec.Template.Spec, m.agentd.Spec.Template.Spec} {
		for _, ct := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			for _, e := range ct.Env {
				if e.Value != "" && secretName.MatchString(e.Name) {
					fail("container %s: %s is a literal value; secrets come from a Secret", ct.Name, e.Name)
				}
			}
			for _, arg := range append(slices.Clone(ct.Command), ct.Args...) {
				if secretName.MatchString(arg) || strings.Contains(arg, "postgres://") {
					fail("container %s: argument %q names a secret; flags show in ps", ct.Name, arg)
				}
			}
			if !slices.ContainsFunc(m.kust.Images, func(i image) bool { return i.Name == ct.Image }) {
				fail("container %s: image %q has no entry in kustomization.yaml's images", ct.Name, ct.Image)
			}
		}
	}

	// The example Secrets hold the keys referenced, with placeholders only.
	keys := map[string]bool{}
	for _, s := range m.examples {
		for k, v := range s.StringData {
			keys[s.Name+"/"+k] = true
			if !strings.Contains(v, "CHANGE-ME") {
				fail("%s: %s/%s holds %q, not a CHANGE-ME placeholder", exampleSecrets, s.Name, k, v)
			}
		}
		if len(s.Data) > 0 {
			fail("%s: %s has data; use stringData placeholders", exampleSecrets, s.Name)
		}
	}
	for _, ct := range []*corev1.Container{c, a} {
		for _, e := range ct.Env {
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && !keys[r.SecretKeyRef.Name+"/"+r.SecretKeyRef.Key] {
				fail("%s: no example of Secret %s key %s (used by %s)", exampleSecrets, r.SecretKeyRef.Name, r.SecretKeyRef.Key, e.Name)
			}
		}
	}
	return errs
}

func ptrString(p *int32) string {
	if p == nil {
		return "unset"
	}
	return strconv.Itoa(int(*p))
}

func selects(sel *metav1.LabelSelector, set labels.Set) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(set)
}

func container(spec corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func containerPort(c *corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// port is the port of a host:port address (0 when there is none).
func port(addr string) int32 {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return int32(n)
}

// flagValue is the value of --name=value or --name value in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// consoleConfig parses the container's arguments and literal environment
// as the console itself does.
func consoleConfig(c *corev1.Container) (config.Config, error) {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		return config.Config{}, fmt.Errorf("the first argument is not serve")
	}
	cfg, rest, err := config.Load("console", c.Args[1:], func(k string) string { return env[k] }, io.Discard)
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("serve takes no argument %q", rest[0])
	}
	return cfg, err
}

// checkProbe wants an HTTP GET of path on the container's port.
func checkProbe(fail func(string, ...any), what string, p *corev1.Probe, path string, c *corev1.Container, want int32) {
	if p == nil || p.HTTPGet == nil {
		fail("%s probe is missing", what)
		return
	}
	if p.HTTPGet.Path != path {
		fail("%s probe asks %q, want %q", what, p.HTTPGet.Path, path)
	}
	got := p.HTTPGet.Port.IntVal
	if p.HTTPGet.Port.Type == intstr.String {
		got = containerPort(c, p.HTTPGet.Port.StrVal)
	}
	if got != want || want == 0 {
		fail("%s probe asks port %s, not the container's port %d", what, p.HTTPGet.Port.String(), want)
	}
}

// fromSecret reports that name is set from a Secret and never literally.
func fromSecret(c *corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value == "" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil &&
				e.ValueFrom.SecretKeyRef.Name != "" && e.ValueFrom.SecretKeyRef.Key != ""
		}
	}
	for _, f := range c.EnvFrom {
		if f.SecretRef != nil && f.SecretRef.Name != "" {
			return true
		}
	}
	return false
}

// TestManifests decodes every manifest strictly and checks the invariants
// the deployment relies on.
func TestManifests(t *testing.T) {
	t.Parallel()
	m, err := load(".", os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range check(m) {
		t.Error(err)
	}
}

// Each invariant fails when what it protects is taken away: mutations of
// the decoded objects, each of which check must report.
func TestManifestInvariantsCatchMutations(t *testing.T) {
	t.Parallel()
	env := func(m *manifests, name string) *corev1.EnvVar {
		c := container(m.console.Spec.Template.Spec, "console")
		for i := range c.Env {
			if c.Env[i].Name == name {
				return &c.Env[i]
			}
		}
		t.Fatalf("no env %s", name)
		return nil
	}
	console := func(m *manifests) *corev1.Container { return container(m.console.Spec.Template.Spec, "console") }
	for _, tc := range []struct {
		name   string
		mutate func(m *manifests)
		want   string
	}{
		{"replicas 2", func(m *manifests) { two := int32(2); m.console.Spec.Replicas = &two }, "replicas 2, want 3"},
		{"replicas unset", func(m *manifests) { m.console.Spec.Replicas = nil }, "replicas unset"},
		{"no readiness probe", func(m *manifests) { console(m).ReadinessProbe = nil }, "console readiness probe is missing"},
		{"readiness on /healthz", func(m *manifests) { console(m).ReadinessProbe.HTTPGet.Path = "/healthz" }, `console readiness probe asks "/healthz"`},
		{"readiness on the metrics port", func(m *manifests) { console(m).ReadinessProbe.HTTPGet.Port = intstr.FromString("metrics") }, "console readiness probe asks port metrics"},
		{"no liveness probe", func(m *manifests) { console(m).LivenessProbe = nil }, "console liveness probe is missing"},
		{"liveness on /readyz", func(m *manifests) { console(m).LivenessProbe.HTTPGet.Path = "/readyz" }, `console liveness probe asks "/readyz"`},
		{"no agentd liveness", func(m *manifests) { container(m.agentd.Spec.Template.Spec, "agentd").LivenessProbe = nil }, "agentd liveness probe is missing"},
		{"database URL inlined", func(m *manifests) {
			e := env(m, "DATABASE_URL")
			e.ValueFrom, e.Value = nil, "postgres://gatehouse:hunter2@db/gatehouse"
		}, "DATABASE_URL does not come from a Secret"},
		{"master key reference removed", func(m *manifests) {
			c := console(m)
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GATEHOUSE_MASTER_KEY" })
		}, "GATEHOUSE_MASTER_KEY does not come from a Secret"},
		{"master key inlined beside its reference", func(m *manifests) { env(m, "GATEHOUSE_MASTER_KEY").Value = "00ff" }, "GATEHOUSE_MASTER_KEY is a literal value"},
		{"a password inlined", func(m *manifests) {
			c := console(m)
			c.Env = append(c.Env, corev1.EnvVar{Name: "GATEHOUSE_ADMIN_PASSWORD", Value: "correct horse"})
		}, "GATEHOUSE_ADMIN_PASSWORD is a literal value"},
		{"agentd token inlined", func(m *manifests) {
			a := container(m.agentd.Spec.Template.Spec, "agentd")
			a.Env = []corev1.EnvVar{{Name: "AGENTD_TOKEN", Value: "0123456789abcdef0123456789abcdef"}}
		}, "AGENTD_TOKEN does not come from a Secret"},
		{"PDB selects other pods", func(m *manifests) {
			m.pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/component": "web"}}
		}, "PodDisruptionBudget: its selector does not select exactly the console's pods"},
		{"PDB selects agentd too", func(m *manifests) {
			m.pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "gatehouse"}}
		}, "PodDisruptionBudget: its selector does not select exactly the console's pods"},
		{"Service selects other pods", func(m *manifests) { m.service.Spec.Selector = map[string]string{"app": "console"} }, "Service: selector"},
		{"Service exposes metrics", func(m *manifests) {
			m.service.Spec.Ports = append(m.service.Spec.Ports, corev1.ServicePort{Name: "metrics", Port: 9090, TargetPort: intstr.FromString("metrics")})
		}, "Service: exposes the metrics port"},
		{"metrics port not annotated", func(m *manifests) { delete(m.console.Spec.Template.Annotations, "prometheus.io/port") }, "prometheus.io/port"},
		{"metrics annotation on the wrong port", func(m *manifests) { m.console.Spec.Template.Annotations["prometheus.io/port"] = "8080" }, "prometheus.io/port \"8080\""},
		{"scrape off", func(m *manifests) { m.console.Spec.Template.Annotations["prometheus.io/scrape"] = "false" }, "not annotated for scraping"},
		{"no --metrics-listen", func(m *manifests) { console(m).Args = []string{"serve", "--listen=0.0.0.0:8080"} }, "metrics are not served"},
		{"a flag the console does not have", func(m *manifests) { console(m).Args = append(console(m).Args, "--metrics-port=9090") }, "does not accept its arguments"},
		{"listen elsewhere", func(m *manifests) { console(m).Args[1] = "--listen=0.0.0.0:8081" }, "does not serve the http container port"},
		{"no memory limit", func(m *manifests) { delete(console(m).Resources.Limits, corev1.ResourceMemory) }, "memory limit"},
		{"example secret applied", func(m *manifests) { m.resources[exampleSecrets] = true }, "would be applied"},
		{"PDB not applied", func(m *manifests) { delete(m.resources, "console-pdb.yaml") }, "does not list console-pdb.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := load(".", os.ReadFile)
			if err != nil {
				t.Fatal(err)
			}
			tc.mutate(m)
			var got []string
			for _, err := range check(m) {
				got = append(got, err.Error())
			}
			if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Fatalf("mutation not caught: want an error containing %q, got %q", tc.want, got)
			}
		})
	}
}

// Decoding is strict: a misspelt or misplaced field fails rather than
// being dropped (a "replica: 3" would otherwise run one replica), and a
// Secret outside the example file fails.
func TestManifestsDecodeStrictly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"misspelt replicas", "console-deployment.yaml", "replicas: 3", "replica: 3", `unknown field "replica"`},
		{"probe field misplaced", "console-deployment.yaml", "              path: /readyz", "              pathh: /readyz", `unknown field "pathh"`},
		{"duplicate field", "console-pdb.yaml", "  maxUnavailable: 1", "  maxUnavailable: 1\n  maxUnavailable: 2", `key "maxUnavailable" already set`},
		{"unknown kustomization field", "kustomization.yaml", "resources:", "resourcez: []\nresources:", `unknown field "resourcez"`},
		{"a Secret among the manifests", "console-service.yaml", "apiVersion: v1\nkind: Service", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: x\n---\napiVersion: v1\nkind: Service", "secrets are created with kubectl"},
		{"an unchecked kind", "console-pdb.yaml", "kind: PodDisruptionBudget", "kind: Job", "not a kind this test checks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			read := func(path string) ([]byte, error) {
				b, err := os.ReadFile(path)
				if err != nil || filepath.Base(path) != tc.file {
					return b, err
				}
				if !bytes.Contains(b, []byte(tc.old)) {
					t.Fatalf("%s has no %q to change", tc.file, tc.old)
				}
				return bytes.Replace(b, []byte(tc.old), []byte(tc.new), 1), nil
			}
			_, err := load(".", read)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
