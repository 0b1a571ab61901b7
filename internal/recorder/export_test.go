package recorder

// PendingCreates counts the creates kept to be sent again.
func (f *Followers) PendingCreates() int {
	n := 0
	f.pending.Range(func(any, any) bool {
		n++
		return true
	})
	return n
}

// LiveWaiting is how many client polls of command id of org wait on this
// process's window of its output: polls that agentd does not see.
func (f *Followers) LiveWaiting(org string, id int64) int {
	f.live.mu.Lock()
	defer f.live.mu.Unlock()
	if c := f.live.cmds[liveKey{org, id}]; c != nil {
		return c.waiting
	}
	return 0
}
