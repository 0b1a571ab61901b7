//go:build !unix

package storetest

import "errors"

// lease is one process's hold on the shared cluster.
type lease struct{ DSN string }

func (l *lease) release() error { return nil }

type clusterConfig struct{}

func defaultClusterConfig() clusterConfig { return clusterConfig{} }

// acquireCluster: throwaway clusters need flock and setsid (unix only).
func acquireCluster(clusterConfig) (*lease, error) {
	return nil, errors.New("a throwaway Postgres cluster is only supported on unix; set GATEHOUSE_TEST_POSTGRES")
}
