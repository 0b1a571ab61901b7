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
