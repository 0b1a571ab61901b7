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

// TestUnseenWrite: after a local write, a version read vouches for it only
// once it reaches what the write's bump produced, never while a bump is
// under way (outside a transaction the write and its bump have committed
// before the bump can store what it produced), and the window bounds a
// bump that never showed (rolled back).
func TestUnseenWrite(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name              string
		wrote             time.Duration // how long ago; 0: never
		produced, bumping int64
		seen              int64
		want              bool
	}{
		{"never wrote", 0, 0, 0, 3, false},
		{"wrote, seen", time.Second, 7, 0, 7, false},
		{"wrote, seen a later one", time.Second, 7, 0, 9, false},
		{"wrote, not seen yet", time.Second, 7, 0, 6, true},
		{"a bump under way", time.Second, 7, 1, 7, true},
		{"not seen past the window", localWriteWindow + time.Second, 7, 0, 6, false},
	}
	for _, c := range cases {
		w := &configWatch{}
		if c.wrote > 0 {
			w.lastWrite.Store(now.Add(-c.wrote).UnixNano())
		}
		w.produced.Store(c.produced)
		w.bumping.Store(int32(c.bumping))
		if got := w.unseenWrite(now, c.seen); got != c.want {
			t.Errorf("%s: unseen %v, want %v", c.name, got, c.want)
		}
	}
}
