package apperr

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// DescribeJSON says in people's words why a JSON document could not be
// decoded. encoding/json's own messages name Go types ("cannot unmarshal
// string into Go value of type agents.Config"), which mean nothing to the
// person who typed the document. what names the document, e.g. "The
// configuration".
func DescribeJSON(what string, err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("%s is not valid JSON (near character %d); check for a missing quote, comma or brace.", what, se.Offset)
	case errors.As(err, &te):
		if te.Field == "" {
			return fmt.Sprintf("%s must be %s, not %s.", what, jsonKind(te.Type), jsonValueWord(te.Value))
		}
		return fmt.Sprintf("The field %q must be %s, not %s.", te.Field, jsonKind(te.Type), jsonValueWord(te.Value))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Sprintf("%s has an unknown field %s.", what, strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return fmt.Sprintf("%s could not be read as JSON.", what)
}

// jsonKind names what a Go type looks like in JSON.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "text in quotes"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list in [ ]"
	case reflect.Struct, reflect.Map:
		return "an object in { }"
	}
	return "a different kind of value"
}

// jsonValueWord names the JSON value encoding/json reports it found.
func jsonValueWord(v string) string {
	switch v {
	case "string":
		return "text"
	case "number":
		return "a number"
	case "bool":
		return "true or false"
	case "array":
		return "a list"
	case "object":
		return "an object"
	}
	return v
}
