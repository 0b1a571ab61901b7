package recorder

import (
	"errors"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// CreateOutcome is what agentd's answer to a command's create says of
// the command: the gateway's exec and a follower sending the create again
// act on the same four.
type CreateOutcome int

const (
	// CreateStarted: agentd started the command and answered.
	CreateStarted CreateOutcome = iota
	// CreateArrived: agentd already holds a command with this id (this
	// console's create, sent twice, arrived first): it runs, once.
	CreateArrived
	// CreateRefused: agentd refused the command; it never ran.
	CreateRefused
	// CreateUnanswered: no answer, or agentd failed: the command may be
	// running or not, and its follower finds out.
	CreateUnanswered
)

// SortCreate sorts the error of agentd's answer to a create into its
// outcome, with agentd's error when the outcome rests on one. An answer
// that was not agentd's (a proxy's page) is never taken for a refusal.
func SortCreate(err error) (CreateOutcome, *agentd.Error) {
	if err == nil {
		return CreateStarted, nil
	}
	var ae *agentd.Error
	switch {
	case !errors.As(err, &ae) || ae.Foreign:
		return CreateUnanswered, nil
	case ae.Code == agentd.CodeIDInUse:
		return CreateArrived, ae
	case ae.Status < 500:
		return CreateRefused, ae
	}
	return CreateUnanswered, ae
}

// pendingKey names a create this process sent without an answer, by the
// org's slug and open database (ids start over in a re-created org).
type pendingKey struct {
	org string
	db  *gorm.DB
	id  int64
}

// CreatePending keeps a command's create until agentd answered it, so a
// follower can send it again (it holds the environment variables, which
// are never stored). It is forgotten by CreateDone, or when the command's
// follower ends or cannot start.
func (f *Followers) CreatePending(org Org, id int64, req agentd.CreateSessionRequest) {
	f.pending.Store(pendingKey{org.Slug, org.DB, id}, req)
}

func (f *Followers) pendingCreate(org Org, id int64) (agentd.CreateSessionRequest, bool) {
	v, ok := f.pending.Load(pendingKey{org.Slug, org.DB, id})
	if !ok {
		return agentd.CreateSessionRequest{}, false
	}
	return v.(agentd.CreateSessionRequest), true
}

// CreateDone forgets a create agentd answered.
func (f *Followers) CreateDone(org Org, id int64) { f.pending.Delete(pendingKey{org.Slug, org.DB, id}) }

// dropPending forgets any create of command id of org slug, whatever
// database it was kept for: its follower is gone.
func (f *Followers) dropPending(slug string, id int64) {
	f.pending.Range(func(k, _ any) bool {
		if pk := k.(pendingKey); pk.org == slug && pk.id == id {
			f.pending.Delete(k)
		}
		return true
	})
}
