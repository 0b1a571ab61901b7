// Package apidoc holds the OpenAPI document of the JSON API. It is written
// by hand in openapi.yaml (kept true by the handler tests, which check it
// against the route table and validate every request and response they make)
// and embedded in the binary, which serves it as JSON.
package apidoc

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
)

//go:embed openapi.yaml
var source []byte

// YAML is the document as written.
func YAML() []byte { return append([]byte(nil), source...) }

// Load parses the document, expands each operation's error codes (see
// expandErrors) and validates it. Each call returns a fresh copy, so
// callers may not disturb one another.
func Load(ctx context.Context) (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	loader.Context = ctx
	doc, err := loader.LoadFromData(source)
	if err != nil {
		return nil, fmt.Errorf("apidoc: parse openapi.yaml: %w", err)
	}
	if err := expandErrors(doc); err != nil {
		return nil, err
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("apidoc: openapi.yaml is not a valid OpenAPI document: %w", err)
	}
	return doc, nil
}

// Served renders the document as JSON once, for /api/v1/openapi.json.
type Served struct {
	once sync.Once
	body []byte
	err  error
}

// JSON is the document as JSON; the rendering is done on first use.
func (s *Served) JSON(ctx context.Context) ([]byte, error) {
	s.once.Do(func() {
		doc, err := Load(ctx)
		if err != nil {
			s.err = err
			return
		}
		s.body, s.err = json.Marshal(doc)
		if s.err != nil {
			s.err = fmt.Errorf("apidoc: render json: %w", s.err)
		}
	})
	return s.body, s.err
}
