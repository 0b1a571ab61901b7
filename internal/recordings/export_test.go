package recordings

import "testing"

// recordingsForge rewrites the first chunk of a frame's data, keeping its
// length, as someone editing the database would.
func forgeFrame(t *testing.T, body []byte) []byte {
	t.Helper()
	cs, err := decodeFrame(body)
	if err != nil || len(cs) == 0 {
		t.Fatalf("decode: %v", err)
	}
	cs[0].Data = []byte("LINE 1\n")
	out, _, _, err := encodeFrame("", cs)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ForgeFrame is forgeFrame for the external tests.
var ForgeFrame = forgeFrame
