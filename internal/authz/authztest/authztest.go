// Package authztest checks that authorized services account for every
// method, in the manner of Coder's dbauthz setup test: a method that takes
// an actor must have an authorization test, and one that does not must be
// listed with the reason it needs none. Adding a method without either
// fails the build's tests.
package authztest

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
)

var (
	ctxType   = reflect.TypeOf((*context.Context)(nil)).Elem()
	actorType = reflect.TypeOf(&authz.Actor{})
)

// Accounted fails t for every exported method of svc (a pointer to a
// service) that takes an *authz.Actor but has no entry in tested, or takes
// none and has no reason in unguarded; and for entries naming no method.
func Accounted(t *testing.T, svc any, tested map[string]bool, unguarded map[string]string) {
	t.Helper()
	typ := reflect.TypeOf(svc)
	seen := map[string]bool{}
	var names []string
	for i := 0; i < typ.NumMethod(); i++ {
		names = append(names, typ.Method(i).Name)
	}
	sort.Strings(names)
	for _, name := range names {
		m, _ := typ.MethodByName(name)
		seen[name] = true
		if takesActor(m.Type) {
			if !tested[name] {
				t.Errorf("%s.%s takes an actor but has no authorization test", typ.Elem().Name(), name)
			}
			if _, ok := unguarded[name]; ok {
				t.Errorf("%s.%s takes an actor yet is listed as unguarded", typ.Elem().Name(), name)
			}
			continue
		}
		if unguarded[name] == "" {
			t.Errorf("%s.%s takes no actor: check the caller in it, or list it as unguarded with the reason", typ.Elem().Name(), name)
		}
	}
	for name := range tested {
		if !seen[name] {
			t.Errorf("authorization test for %s.%s, which does not exist", typ.Elem().Name(), name)
		}
	}
	for name := range unguarded {
		if !seen[name] {
			t.Errorf("unguarded entry for %s.%s, which does not exist", typ.Elem().Name(), name)
		}
	}
}

// takesActor reports whether a method (receiver first) takes a context and
// then the actor.
func takesActor(f reflect.Type) bool {
	return f.NumIn() >= 3 && f.In(1) == ctxType && f.In(2) == actorType
}

// Outcome is what an authorized call should come to.
type Outcome int

// Outcomes.
const (
	// Allowed: no refusal (the call may still fail for other reasons, such
	// as a backend that is not there; that is not an authorization answer).
	Allowed Outcome = iota
	// Hidden: "not found", with a recorded denial.
	Hidden
	// Forbidden: "forbidden", with a recorded denial.
	Forbidden
)

func (o Outcome) String() string {
	return [...]string{"allowed", "hidden (404)", "forbidden (403)"}[o]
}

// Want checks err against want and that a refusal was recorded on a (and
// only then).
func Want(t *testing.T, a *authz.Actor, err error, want Outcome) {
	t.Helper()
	got := Allowed
	switch {
	case errors.Is(err, apperr.ErrNotFound):
		got = Hidden
	case errors.Is(err, apperr.ErrForbidden):
		got = Forbidden
	}
	if got != want {
		t.Errorf("got %s (%v), want %s", got, err, want)
	}
	denied := len(a.Denials()) > 0
	if want != Allowed && !denied {
		t.Errorf("refused without recording a denial")
	}
	if want == Allowed && denied {
		t.Errorf("allowed, yet recorded denials %+v", a.Denials())
	}
}
