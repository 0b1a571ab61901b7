package apperr

// WithCause answers with show and keeps cause for the log: errors.As finds
// show (what the caller is told), Error() says both (what is logged). Use
// it when the cause names something the caller may not see, such as an
// environment's address.
func WithCause(show *Error, cause error) error {
	if cause == nil {
		return show
	}
	return &withCause{show: show, cause: cause}
}

type withCause struct {
	show  *Error
	cause error
}

func (w *withCause) Error() string   { return w.show.Message + ": " + w.cause.Error() }
func (w *withCause) Unwrap() []error { return []error{w.show, w.cause} }
