package agentd

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// paxBomb is a tar.gz of count PAX extended headers of about 1 MiB each,
// then one 1-byte file: a few hundred KiB that decompress to count MiB the
// tar reader consumes itself, before any entry reaches the caller. Gzip
// members are concatenated (the reader reads them as one stream), so the
// header is compressed once.
func paxBomb(t *testing.T, count int) []byte {
	t.Helper()
	rec := " comment=" + strings.Repeat("a", 1<<20-64) + "\n"
	for l := len(fmt.Sprint(len(rec))); ; l++ {
		if len(fmt.Sprint(len(rec)+l)) == l {
			rec = fmt.Sprint(len(rec)+l) + rec
			break
		}
	}
	var hb bytes.Buffer
	tw := tar.NewWriter(&hb)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "PaxHeaders/f", Size: int64(len(rec)), Mode: 0o644, Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	h := append([]byte(nil), hb.Bytes()[:512]...)
	h[156] = tar.TypeXHeader
	copy(h[148:156], "        ")
	sum := 0
	for _, c := range h {
		sum += int(c)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	member := func(data ...[]byte) []byte {
		var b bytes.Buffer
		gz, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		for _, d := range data {
			gz.Write(d)
		}
		gz.Close()
		return b.Bytes()
	}
	one := member(h, []byte(rec), make([]byte, (512-len(rec)%512)%512))
	var last bytes.Buffer
	tw = tar.NewWriter(&last)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "f", Size: 1, Mode: 0o644})
	tw.Write([]byte("x"))
	tw.Close()
	return append(bytes.Repeat(one, count), member(last.Bytes())...)
}

// The unpack limit bounds what a tar.gz decompresses to, headers the tar
// reader consumes itself included: an archive of 500 PAX headers of 1 MiB
// each is refused as over the limit having decompressed little more than
// the limit, not 500 MiB.
func TestArchivePAXHeadersCountTowardTheUnpackLimit(t *testing.T) {
	const limit = 4 << 20
	arc := filepath.Join(t.TempDir(), "bomb.tar.gz")
	if err := os.WriteFile(arc, paxBomb(t, 500), 0o600); err != nil {
		t.Fatal(err)
	}
	file, err := os.Open(arc)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	tw := newTreeWriter(root, writeLimits{maxBytes: 1 << 20, unpackBytes: limit, unpackFiles: 10})
	err = unpackTarGz(tw, file)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(limit)) {
		t.Fatalf("got %v; want the over-limit error naming %d", err, limit)
	}
	if tw.decompressed > 2*limit {
		t.Fatalf("decompressed %d bytes before refusing; want at most %d", tw.decompressed, 2*limit)
	}
}

// A tar.gz within the limit unpacks whole: the slack covers its headers.
func TestArchiveWithinTheLimitUnpacks(t *testing.T) {
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)
	for i := range 10 {
		body := strings.Repeat("z", 100)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.Repeat("d/", 80) + fmt.Sprint(i), Size: int64(len(body)), Mode: 0o644})
		tw.Write([]byte(body))
	}
	tw.Close()
	gz.Close()
	arc := filepath.Join(t.TempDir(), "ok.tar.gz")
	if err := os.WriteFile(arc, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	file, err := os.Open(arc)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	w := newTreeWriter(root, writeLimits{maxBytes: 1 << 20, unpackBytes: 1000, unpackFiles: 100})
	if err := unpackTarGz(w, file); err != nil {
		t.Fatal(err)
	}
	if w.files != 10 || w.bytes != 1000 {
		t.Fatalf("unpacked %d files, %d bytes; want 10, 1000", w.files, w.bytes)
	}
}
