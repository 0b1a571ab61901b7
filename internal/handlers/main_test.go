package handlers_test

import (
	"testing"

	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
)

// agentdBin is the real agentd the fake sandbox backend runs.
var agentdBin e2bfaketest.Binary

func TestMain(m *testing.M) {
	e2bfaketest.Main(m, func(b e2bfaketest.Binary) { agentdBin = b })
}
