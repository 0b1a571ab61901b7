package recordings

import (
	"testing"
	"time"
)

// BenchmarkKeystrokeFrame measures what a stdin frame's typist adds to
// recording one keystroke before the database: encoding and chaining the
// frame with and without the typist chunk, and the size it stores.
func BenchmarkKeystrokeFrame(b *testing.B) {
	typist := Typist{Type: "user", ID: "42", Name: "mia.hernandez@acme.example", Via: "login:0a1b2c3d4e5f"}
	for _, withTypist := range []bool{false, true} {
		name := "keystroke"
		if withTypist {
			name = "keystroke_with_typist"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			size := 0
			for b.Loop() {
				at := time.Now()
				chunks := []Chunk{{Seq: 2, Stream: StreamStdin, At: at, Data: []byte("k")}}
				if withTypist {
					chunks = append([]Chunk{{Seq: 1, Stream: StreamTypist, At: at, Data: encodeTypist(typist)}}, chunks...)
				}
				body, _, _, err := encodeFrame("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", chunks)
				if err != nil {
					b.Fatal(err)
				}
				size = len(body)
			}
			b.ReportMetric(float64(size), "body-bytes")
		})
	}
}
