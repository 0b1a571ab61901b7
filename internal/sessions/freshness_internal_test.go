package sessions

import (
	"testing"
	"time"

	"gorm.io/gorm"
)

// TestCacheKeyIsThePool: a service over a transaction of the org keys its
// entries by the org's pool, like the services over the pool itself; two
// databases under one slug never share a key.
func TestCacheKeyIsThePool(t *testing.T) {
	pool, tx, other := &gorm.DB{}, &gorm.DB{}, &gorm.DB{}
	onPool := &Service{DB: pool, Org: "acme"}
	onTx := &Service{DB: tx, Pool: pool, Org: "acme"}
	recreated := &Service{DB: other, Org: "acme"}
	if onPool.key(1) != onTx.key(1) {
		t.Error("a service over a transaction keys its entries apart from the pool's")
	}
	if onPool.key(1) == recreated.key(1) {
		t.Error("two databases under one slug share a cache key")
	}
}

// TestForgetOrg: ForgetOrg drops the org's entries, gates and version,
// and only those.
func TestForgetOrg(t *testing.T) {
	r := NewRuntime()
	now := time.Now()
	pools := map[string]*gorm.DB{"acme": {}, "globex": {}}
	for org, db := range pools {
		k := cacheKey{db: db, org: org, id: 1}
		r.gate(k)
		r.put(k, &cached{checked: now, refresh: time.Minute})
		r.config.of(db, org)
	}
	r.ForgetOrg("acme")
	if _, ok := r.get(cacheKey{db: pools["acme"], org: "acme", id: 1}); ok || len(r.cache) != 1 || len(r.gates) != 1 {
		t.Errorf("after ForgetOrg(acme): acme cached %v, %d entries, %d gates; want only globex's", ok, len(r.cache), len(r.gates))
	}
	if _, ok := r.config.orgs[pools["acme"]]; ok || len(r.config.orgs) != 1 {
		t.Errorf("after ForgetOrg(acme): %d versions kept, acme's among them: %v", len(r.config.orgs), ok)
	}
}

// TestVersionsOnePerOrg: a new pool of an org (reopened after an idle
// close, or a re-created org) replaces the old one's version entry.
func TestVersionsOnePerOrg(t *testing.T) {
	r := NewRuntime()
	first, second := &gorm.DB{}, &gorm.DB{}
	r.config.of(first, "acme")
	r.config.of(second, "acme")
	r.config.of(&gorm.DB{}, "globex")
	if _, ok := r.config.orgs[second]; !ok || len(r.config.orgs) != 2 {
		t.Errorf("%d version entries (the new pool's kept: %v), want one per org", len(r.config.orgs), ok)
	}
}
