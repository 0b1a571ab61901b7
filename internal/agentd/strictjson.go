package agentd

import (
	"encoding/json"
	"io"
	"reflect"
	"strings"
)

// checkStrictJSON enforces what encoding/json does not: the body is one JSON
// object (not null), its keys match the json names of v's struct fields
// exactly (encoding/json matches them case-insensitively), no object
// anywhere holds a key twice (encoding/json keeps the last), and nothing
// follows the object. Type errors are left to the decoder.
func checkStrictJSON(raw []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return jsonError(err, 0)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return newError(CodeMalformedJSON, "The body must be a JSON object.")
	}
	fields := jsonFieldNames(v)
	if err := walkObject(dec, fields); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return newError(CodeMalformedJSON, "The body must hold a single JSON object with nothing after it.")
	}
	return nil
}

// walkObject consumes the rest of an object whose '{' was read, refusing
// duplicate keys and, when fields is not nil, keys not in fields.
func walkObject(dec *json.Decoder, fields map[string]bool) error {
	seen := make(map[string]bool)
	for {
		tok, err := dec.Token()
		if err != nil {
			return jsonError(err, 0)
		}
		if d, ok := tok.(json.Delim); ok && d == '}' {
			return nil
		}
		key, _ := tok.(string)
		if seen[key] {
			return newError(CodeMalformedJSON, "The body has the key %q more than once.", key)
		}
		seen[key] = true
		if fields != nil && !fields[key] {
			return newError(CodeMalformedJSON, "The body has an unknown field %q.", key)
		}
		if err := walkValue(dec); err != nil {
			return err
		}
	}
}

// walkValue consumes one value, checking nested objects for duplicates.
func walkValue(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return jsonError(err, 0)
	}
	d, ok := tok.(json.Delim)
	switch {
	case !ok:
		return nil
	case d == '{':
		return walkObject(dec, nil)
	case d == '[':
		for dec.More() {
			if err := walkValue(dec); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return jsonError(err, 0)
		}
	}
	return nil
}

// jsonFieldNames lists the json names of the fields of the struct v points
// to.
func jsonFieldNames(v any) map[string]bool {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	names := make(map[string]bool, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
			continue
		case name == "":
			name = f.Name
		}
		names[name] = true
	}
	return names
}
