package handlers

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
)

// countingReader counts what was read of it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// zeros is an endless source of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// multipartForm is a form whose fields come in the given order; a field
// named "file" carries size zero bytes as a file.
func multipartForm(t *testing.T, size int64, fields ...[2]string) (io.Reader, string) {
	t.Helper()
	var head bytes.Buffer
	mw := multipart.NewWriter(&head)
	var parts []io.Reader
	for _, f := range fields {
		if f[0] != "file" {
			if err := mw.WriteField(f[0], f[1]); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if _, err := mw.CreateFormFile("file", f[1]); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, bytes.NewReader(bytes.Clone(head.Bytes())), io.LimitReader(zeros{}, size))
		head.Reset()
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	parts = append(parts, &head)
	return io.MultiReader(parts...), mw.FormDataContentType()
}

// TestCSRFReadsOnlyTheLeadingFieldOfAMultipartForm: the CSRF check of a
// multipart form reads the _csrf field the page sends first and nothing
// past it, so a forged or anonymous upload is refused before its file is
// read (it used to parse the whole form, up to 50 MiB, for anyone). A
// form it accepts reaches the handler whole.
func TestCSRFReadsOnlyTheLeadingFieldOfAMultipartForm(t *testing.T) {
	t.Parallel()
	const csrf = "csrf-token-0123456789abcdef"
	const fileSize = 8 << 20
	tests := []struct {
		name     string
		fields   [][2]string
		wantCode int
	}{
		{"no _csrf", [][2]string{{"file", "big.bin"}, {"kind", "file"}}, http.StatusForbidden},
		{"_csrf after the file", [][2]string{{"file", "big.bin"}, {"_csrf", csrf}}, http.StatusForbidden},
		{"wrong _csrf first", [][2]string{{"_csrf", strings.Repeat("x", len(csrf))}, {"file", "big.bin"}}, http.StatusForbidden},
		{"_csrf first", [][2]string{{"_csrf", csrf}, {"kind", "file"}, {"file", "big.bin"}}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := echo.New()
			s := &Server{e: e}
			e.HTTPErrorHandler = s.handleError
			var got struct {
				csrf, kind string
				size       int64
			}
			e.POST("/o/acme/agents/1/uploads", s.csrf(func(c echo.Context) error {
				r := c.Request()
				if err := r.ParseMultipartForm(1 << 20); err != nil {
					return err
				}
				got.csrf, got.kind = r.FormValue("_csrf"), r.FormValue("kind")
				f, _, err := r.FormFile("file")
				if err != nil {
					return err
				}
				defer f.Close()
				got.size, err = io.Copy(io.Discard, f)
				if err != nil {
					return err
				}
				return c.NoContent(http.StatusOK)
			}))
			body, ct := multipartForm(t, fileSize, tt.fields...)
			cr := &countingReader{r: body}
			req := httptest.NewRequest(http.MethodPost, "/o/acme/agents/1/uploads", cr)
			req.Header.Set("Content-Type", ct)
			req.AddCookie(&http.Cookie{Name: "gh_org_acme", Value: "not-a-session"})
			req.AddCookie(&http.Cookie{Name: csrfCookie, Value: csrf})
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, req)
			if rec.Code != tt.wantCode {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.wantCode, rec.Body)
			}
			if tt.wantCode == http.StatusForbidden {
				if !strings.Contains(rec.Body.String(), "did not come from Gatehouse") {
					t.Errorf("refusal %s, want the CSRF failure", rec.Body)
				}
				if cr.n > maxCSRFPrefix {
					t.Errorf("the refused form's body was read for %d bytes; the CSRF check reads at most %d", cr.n, maxCSRFPrefix)
				}
				return
			}
			if got.csrf != csrf || got.kind != "file" || got.size != fileSize {
				t.Errorf("the handler saw _csrf %q, kind %q and a file of %d bytes; want the whole form", got.csrf, got.kind, got.size)
			}
		})
	}
}
