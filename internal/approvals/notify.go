package approvals

import "sync"

// Notifier tells waiters in this process that a request left pending, so a
// decision made on the same replica releases them at once. Waiters on other
// replicas notice through the database (Service.PollEvery). One Notifier
// serves every org of a process; build it in main and share it.
type Notifier struct {
	mu   sync.Mutex
	subs map[notifyKey]chan struct{}
}

type notifyKey struct {
	org string
	id  int64
}

// NewNotifier returns an empty notifier.
func NewNotifier() *Notifier { return &Notifier{subs: map[notifyKey]chan struct{}{}} }

// wait returns a channel closed at the next notify of (org, id).
func (n *Notifier) wait(org string, id int64) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := notifyKey{org, id}
	ch := n.subs[k]
	if ch == nil {
		ch = make(chan struct{})
		n.subs[k] = ch
	}
	return ch
}

// notify releases every waiter of (org, id).
func (n *Notifier) notify(org string, id int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := notifyKey{org, id}
	if ch := n.subs[k]; ch != nil {
		close(ch)
		delete(n.subs, k)
	}
}
