package compose

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// composeFile is the part of the compose file the test reads.
type composeFile struct {
	Services map[string]service `json:"services"`
}

type service struct {
	Image     string            `json:"image"`
	Build     any               `json:"build"`
	Ports     []string          `json:"ports"`
	Expose    []string          `json:"expose"`
	Volumes   []string          `json:"volumes"`
	Env       map[string]string `json:"environment"`
	DependsOn any               `json:"depends_on"`
	Deploy    struct {
		Replicas int `json:"replicas"`
	} `json:"deploy"`
	Healthcheck *struct {
		Test []string `json:"test"`
	} `json:"healthcheck"`
}

// dependsHealthy reports that s waits for dep to be healthy.
func (s service) dependsHealthy(dep string) bool {
	m, ok := s.DependsOn.(map[string]any)
	if !ok {
		return false
	}
	d, ok := m[dep].(map[string]any)
	return ok && d["condition"] == "service_healthy"
}

// check lists what the compose file and the proxy's configuration break.
func check(c composeFile, nginx string) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	con, ok := c.Services["console"]
	if !ok {
		return []error{fmt.Errorf("no console service")}
	}
	if con.Deploy.Replicas != 2 {
		fail("console: deploy.replicas %d, want 2", con.Deploy.Replicas)
	}
	if len(con.Ports) > 0 {
		fail("console: publishes %v; with two replicas only the proxy publishes a port", con.Ports)
	}
	if !con.dependsHealthy("postgres") {
		fail("console: does not wait for a healthy postgres")
	}
	if !strings.Contains(con.Env["DATABASE_URL"], "@postgres:5432/") {
		fail("console: DATABASE_URL %q is not the postgres service", con.Env["DATABASE_URL"])
	}
	if !strings.HasPrefix(con.Env["GATEHOUSE_MASTER_KEY"], "${GATEHOUSE_MASTER_KEY:?") {
		fail("console: the master key must come from the caller's environment (and be required), not a default: %q", con.Env["GATEHOUSE_MASTER_KEY"])
	}
	_, consolePort, err := net.SplitHostPort(con.Env["GATEHOUSE_LISTEN"])
	if err != nil {
		fail("console: GATEHOUSE_LISTEN %q: %v", con.Env["GATEHOUSE_LISTEN"], err)
	}
	if con.Healthcheck == nil || !strings.Contains(strings.Join(con.Healthcheck.Test, " "), "/readyz") {
		fail("console: its healthcheck does not ask /readyz")
	}

	dbs, published := 0, map[string][]string{}
	for name, s := range c.Services {
		if strings.HasPrefix(s.Image, "postgres:") {
			dbs++
		}
		if len(s.Ports) > 0 {
			published[name] = s.Ports
		}
	}
	if dbs != 1 {
		fail("%d Postgres services, want one shared by the replicas", dbs)
	}
	proxy, ok := c.Services["proxy"]
	if len(published) != 1 || !ok || len(proxy.Ports) != 1 {
		fail("published ports %v: want one, the proxy's", published)
	}
	if ok && !proxy.dependsHealthy("console") {
		fail("proxy: does not wait for healthy consoles")
	}
	if ok && !strings.Contains(strings.Join(proxy.Volumes, " "), "./deploy/compose/nginx.conf:") {
		fail("proxy: does not mount deploy/compose/nginx.conf")
	}
	if !regexp.MustCompile(`(?m)^\s*server\s+console:` + regexp.QuoteMeta(consolePort) + `;`).MatchString(nginx) {
		fail("nginx.conf: the upstream is not console:%s", consolePort)
	}
	for _, want := range []string{"proxy_pass http://console;", "proxy_set_header Upgrade $http_upgrade;", "proxy_set_header Connection $connection_upgrade;", "proxy_buffering off;"} {
		if !strings.Contains(nginx, want) {
			fail("nginx.conf: no %q (terminals are WebSockets; output streams)", want)
		}
	}
	return errs
}

func load(t *testing.T) (composeFile, string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docker-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	n, err := os.ReadFile("nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	return c, string(n)
}

// docker-compose.yaml mirrors the Kubernetes deployment: two console
// replicas on one Postgres behind one published port.
func TestComposeRunsTwoReplicasBehindOnePort(t *testing.T) {
	t.Parallel()
	c, nginx := load(t)
	for _, err := range check(c, nginx) {
		t.Error(err)
	}
}

// The check fails when the file stops doing so.
func TestComposeCheckCatchesMutations(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(c *composeFile, nginx *string)
		want   string
	}{
		{"one replica", func(c *composeFile, _ *string) {
			s := c.Services["console"]
			s.Deploy.Replicas = 1
			c.Services["console"] = s
		}, "deploy.replicas 1"},
		{"console published", func(c *composeFile, _ *string) {
			s := c.Services["console"]
			s.Ports = []string{"127.0.0.1:8081:8080"}
			c.Services["console"] = s
		}, "only the proxy publishes"},
		{"no proxy", func(c *composeFile, _ *string) { delete(c.Services, "proxy") }, "want one, the proxy's"},
		{"a second database", func(c *composeFile, _ *string) { c.Services["postgres2"] = service{Image: "postgres:16"} }, "2 Postgres services"},
		{"upstream elsewhere", func(_ *composeFile, n *string) {
			*n = strings.Replace(*n, "server console:8080;", "server console:9090;", 1)
		}, "the upstream is not console:8080"},
		{"no websocket upgrade", func(_ *composeFile, n *string) {
			*n = strings.Replace(*n, "proxy_set_header Upgrade $http_upgrade;", "", 1)
		}, "Upgrade"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, nginx := load(t)
			tc.mutate(&c, &nginx)
			errs := check(c, nginx)
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Fatalf("mutation not caught: want an error containing %q, got %v", tc.want, errs)
		})
	}
}
