package recordings

import "testing"

// ForgeTypist rewrites the typist of a stdin frame's body, as someone
// editing the database to blame another person would.
func ForgeTypist(t *testing.T, body []byte, name string) []byte {
	t.Helper()
	cs, err := decodeFrame(body)
	if err != nil || len(cs) == 0 || cs[0].Stream != StreamTypist {
		t.Fatalf("decode a stdin frame: %v %+v", err, cs)
	}
	ty, _ := decodeTypist(cs[0].Data)
	ty.Name = name
	cs[0].Data = encodeTypist(ty)
	out, _, _, err := encodeFrame("", cs)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
