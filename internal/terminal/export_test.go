package terminal

// ShellParts are the integrations ShellCommand quotes, by name.
func ShellParts() map[string]string {
	return map[string]string{"bashIntegration": bashIntegration, "zshEnv": zshEnv, "zshProfile": zshProfile, "zshRC": zshRC, "zshBoot": zshBoot}
}

// DropAll closes every open terminal connection abruptly, as a lost
// network does, and says how many there were.
func (t *Terminals) DropAll() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.conns)
	for c := range t.conns {
		_ = c.CloseNow()
	}
	return n
}
