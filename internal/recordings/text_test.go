package recordings_test

import (
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/recordings"
)

func TestStrip(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   []string // written in these pieces
		want string
	}{
		{"plain text", []string{"hello world\n"}, "hello world\n"},
		{"colours", []string{"\x1b[1;31merror\x1b[0m: disk full\r\n"}, "error: disk full\n"},
		{"a sequence split across chunks", []string{"ok \x1b[3", "8;5;196mred\x1b", "[0m done"}, "ok red done"},
		{"window title (OSC ended by BEL)", []string{"\x1b]0;user@host: ~\x07$ ls\r\n"}, "$ ls\n"},
		{"hyperlink (OSC ended by ST)", []string{"\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ text"}, "link text"},
		{"charset designation", []string{"\x1b(Bplain\x1b)0"}, "plain"},
		{"keypad mode and save cursor", []string{"\x1b=\x1b7a\x1b8b\x1b>"}, "ab"},
		{"DCS string", []string{"\x1bPq#0;2;0;0;0\x1b\\after"}, "after"},
		{"progress bar carriage returns", []string{"10%\r50%\r100%\r\n"}, "10%\n50%\n100%\n"},
		{"CR LF split across chunks", []string{"one\r", "\ntwo"}, "one\ntwo"},
		{"bell, backspace and NUL dropped; tab kept", []string{"a\x07b\x08c\x00d\te"}, "abcd\te"},
		{"UTF-8 kept, also when split", []string{"gr\xc3", "\xbc\xc3\x9fe \xe2\x9c\x93"}, "grüße ✓"},
		{"bytes that are not UTF-8 become ?", []string{"a\xffb"}, "a?b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s recordings.Stripper
			var out []byte
			for _, p := range tc.in {
				out = s.Append(out, []byte(p))
			}
			if got := string(recordings.ValidUTF8(out)); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if got := recordings.Strip([]byte(strings.Join(tc.in, ""))); got != tc.want {
				t.Fatalf("in one piece: got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseQuery(t *testing.T) {
	t.Parallel()
	cases := []struct {
		q       string
		check   func(recordings.Query) bool
		wantErr string
	}{
		{q: "session:12 agent:coder user:mia@acme.test exit:0 state:exited zebra", check: func(f recordings.Query) bool {
			return f.SessionID == 12 && f.Agent == "coder" && f.User == "mia@acme.test" && f.Exit != nil && *f.Exit == 0 &&
				f.State == "exited" && len(f.Text) == 1 && f.Text[0] == "zebra"
		}},
		{q: `agent:"build bot" "disk full" http://x`, check: func(f recordings.Query) bool {
			return f.Agent == "build bot" && len(f.Text) == 2 && f.Text[0] == "disk full" && f.Text[1] == "http://x"
		}},
		{q: `"since:today" exit:nonzero`, check: func(f recordings.Query) bool {
			return f.NonZero && len(f.Text) == 1 && f.Text[0] == "since:today"
		}},
		{q: "since:2026-01-02 until:2026-01-31", check: func(f recordings.Query) bool {
			return f.Since.Format("2006-01-02") == "2026-01-02" && f.Until.Format("2006-01-02") == "2026-02-01"
		}},
		{q: "state:sleeping", wantErr: "Unknown state"},
		{q: "exit:x", wantErr: "not an exit code"},
		{q: "session:abc", wantErr: "not a session number"},
		{q: "since:2026-02-01 until:2026-01-01", wantErr: "before until"},
		{q: `"open`, wantErr: "not closed"},
		{q: "-- ::", wantErr: "no letter or digit"},
		{q: "agent:a agent:b", wantErr: "given twice"},
		{q: "user:", wantErr: "needs a value"},
	}
	for _, tc := range cases {
		t.Run(tc.q, func(t *testing.T) {
			f, err := recordings.ParseQuery(tc.q)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error()+validationText(err), tc.wantErr) {
					t.Fatalf("got %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(f) {
				t.Fatalf("parsed %+v", f)
			}
		})
	}
}
