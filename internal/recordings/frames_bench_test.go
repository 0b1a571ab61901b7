package recordings

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"testing"
	"time"
)

// BenchmarkEncodeFrame measures what the follower spends per megabyte of
// bulk output before the database: compressing and chaining one agentd
// batch (1 MiB in 64 KiB chunks, agentd's default poll size).
func BenchmarkEncodeFrame(b *testing.B) {
	random := make([]byte, 48<<10)
	_, _ = rand.Read(random)
	kinds := []struct {
		name  string
		chunk []byte
	}{
		{"compressible text", bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog 0123456789\n"), 64<<10/55+1)[:64<<10]},
		{"random base64", []byte(base64.StdEncoding.EncodeToString(random))},
	}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			var chunks []Chunk
			for i := range 16 {
				chunks = append(chunks, Chunk{Seq: uint64(i + 1), Stream: StreamStdout, At: time.Now(), Data: k.chunk})
			}
			b.SetBytes(int64(16 * len(k.chunk)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, _, err := encodeFrame("", chunks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
