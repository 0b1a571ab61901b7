package apperr_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

func TestWithCause(t *testing.T) {
	cause := errors.New(`Post "http://10.0.0.7:7777/v1/sessions": connection refused`)
	err := apperr.WithCause(apperr.New(apperr.ErrUpstream, "environment_unreachable", "The environment did not answer."), cause)
	var ae *apperr.Error
	if !errors.As(err, &ae) || ae.Message != "The environment did not answer." || strings.Contains(ae.Message, "10.0.0.7") {
		t.Fatalf("shown error %+v", ae)
	}
	if !errors.Is(err, apperr.ErrUpstream) || !errors.Is(err, cause) {
		t.Fatal("the kind or the cause is lost")
	}
	if !strings.Contains(err.Error(), "10.0.0.7") {
		t.Fatalf("the log text %q lost the cause", err.Error())
	}
	if got := apperr.WithCause(ae, nil); got != ae {
		t.Fatal("without a cause the shown error is the error")
	}
}
