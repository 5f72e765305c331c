package loader

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aiinference/operator/internal/loadspec"
)

// Error is a failure with a stable reason (one of the loadspec Reason constants).
// Every error Run returns is, or wraps, an *Error; anything else is reported as a
// transient failure.
type Error struct {
	Reason string
	// Path names the file concerned, if any (relative to the destination).
	Path string
	Err  error
}

func (e *Error) Error() string {
	if e.Path != "" {
		return fmt.Sprintf("%s: %s: %v", e.Reason, e.Path, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Reason, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// failf builds an *Error with a formatted message.
func failf(reason, path, format string, args ...any) *Error {
	return &Error{Reason: reason, Path: path, Err: fmt.Errorf(format, args...)}
}

// reasonOf returns the reason of err: the one it carries, Timeout for an expired
// deadline, TransientError for anything else.
func reasonOf(err error) string {
	var le *Error
	if errors.As(err, &le) {
		return le.Reason
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return loadspec.ReasonTimeout
	}
	return loadspec.ReasonTransient
}

// ExitCode maps a Run error to the loader's process exit code (see loadspec).
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	return int(loadspec.ExitCodeOf(reasonOf(err)))
}

// FailureOf turns a Run error into the summary's failure block.
func FailureOf(err error) *loadspec.Failure {
	if err == nil {
		return nil
	}
	code := ExitCode(err)
	reason := reasonOf(err)
	return &loadspec.Failure{
		Reason: reason,
		// The reason is a field of its own; readers print "reason: message".
		Message:   strings.TrimPrefix(err.Error(), reason+": "),
		Retryable: loadspec.IsRetryableExit(int32(code)),
	}
}
