package terminal

// ShellParts are the integrations ShellCommand quotes, by name.
func ShellParts() map[string]string {
	return map[string]string{"bashIntegration": bashIntegration, "zshEnv": zshEnv, "zshProfile": zshProfile, "zshRC": zshRC, "zshBoot": zshBoot}
}
