package gateway

import (
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/recordings"
)

// TestCommandCacheIsPerOrgDatabase: the facts cached about a command belong
// to its org's database, not its slug. An org deleted and created again
// under the same slug starts its command ids over; its command 1 must not
// be taken for the old org's command 1 (whose agentd id and session would
// then be asked for).
func TestCommandCacheIsPerOrgDatabase(t *testing.T) {
	g := &Gateway{}
	old := Org{Slug: "acme", DB: &gorm.DB{}}
	again := Org{Slug: "acme", DB: &gorm.DB{}}
	g.remember(old, recordings.Command{ID: 1, SessionID: 1, AgentdID: "old-agentd-id"})
	if k, ok := g.recall(old, 1); !ok || k.agentdID != "old-agentd-id" {
		t.Fatalf("the org's own command: %+v, %v", k, ok)
	}
	if k, ok := g.recall(again, 1); ok {
		t.Errorf("the re-created org found the old org's command 1: %+v", k)
	}
}
