package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/smithy-go"

	"github.com/aiinference/operator/internal/loadspec"
)

// errStalled is the cancel cause of a part that received no byte within the stall timeout.
var errStalled = errors.New("no bytes received within the stall timeout")

// statusCoder is implemented by the S3 SDK's response errors and by httpStatusError.
type statusCoder interface{ HTTPStatusCode() int }

// httpStatusError is an unexpected HTTP status from an http(s) source.
type httpStatusError struct {
	Status int
	URL    string
	// RetryAfterHeader is the answer's Retry-After (a 429's or 503's), if any.
	RetryAfterHeader string
}

// retryAfter is how long the server asked the client to wait: Retry-After in
// seconds or as an HTTP date; 0 when it said nothing.
func (e *httpStatusError) retryAfter(now time.Time) time.Duration {
	v := strings.TrimSpace(e.RetryAfterHeader)
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		return time.Duration(max(secs, 0)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// maxRetryAfter bounds the wait a server's Retry-After imposes on one retry; a
// server asking for more is given up on (a transient failure: the next
// attempt of the pod tries again after its back-off).
const maxRetryAfter = 5 * time.Minute

func (e *httpStatusError) Error() string {
	return "HTTP " + strconv.Itoa(e.Status) + " from " + e.URL
}

func (e *httpStatusError) HTTPStatusCode() int { return e.Status }

// S3 error codes that say the thing asked for does not exist, that the caller may
// not have it, or that the store is busy or briefly broken.
var (
	notFoundCodes = map[string]bool{"NoSuchBucket": true, "NoSuchKey": true, "NotFound": true}
	deniedCodes   = map[string]bool{
		"AccessDenied": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
		"AllAccessDisabled": true, "InvalidToken": true, "ExpiredToken": true, "Forbidden": true,
		"AccountProblem": true, "InvalidSecurity": true,
		// versitygw answers an unknown access key with a 404 of its own.
		"XAdminUserNotFound": true,
	}
	transientCodes = map[string]bool{
		"SlowDown": true, "Throttling": true, "ThrottlingException": true, "RequestLimitExceeded": true,
		"RequestTimeout": true, "RequestTimeTooSkewed": false, "InternalError": true,
		"ServiceUnavailable": true, "Busy": true, "OperationAborted": true,
	}
)

// classify tells whether the error of one attempt is worth another attempt in this
// run. When it is not, permanent is the *Error the run fails with.
func classify(err error) (retry bool, permanent *Error) {
	var le *Error
	switch {
	case err == nil:
		return false, nil
	case errors.As(err, &le):
		// Already judged (a local disk error, a checksum mismatch, ...): never retried here.
		return false, le
	case errors.Is(err, errStalled):
		return true, nil
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code := apiErr.ErrorCode()
		switch {
		case notFoundCodes[code]:
			return false, &Error{Reason: loadspec.ReasonNotFound, Err: err}
		case deniedCodes[code]:
			return false, &Error{Reason: loadspec.ReasonAccessDenied, Err: err}
		case code == "PreconditionFailed":
			return false, &Error{Reason: loadspec.ReasonTransient,
				Err: errors.New("the object changed in the store during the download; a new run fetches the new version")}
		case transientCodes[code]:
			return true, nil
		}
	}
	var sc statusCoder
	if errors.As(err, &sc) {
		switch s := sc.HTTPStatusCode(); {
		case s == 404 || s == 410:
			return false, &Error{Reason: loadspec.ReasonNotFound, Err: err}
		case s == 401 || s == 403:
			return false, &Error{Reason: loadspec.ReasonAccessDenied, Err: err}
		case s == 412:
			return false, &Error{Reason: loadspec.ReasonTransient,
				Err: errors.New("the object changed in the source during the download; a new run fetches the new version")}
		case s == 408 || s == 429 || s >= 500:
			return true, nil
		case s >= 400:
			return false, &Error{Reason: loadspec.ReasonInvalidConfig, Err: err}
		}
	}
	// Everything else is the network's doing: resets, refused connections, EOF in the
	// middle of a body, timeouts, DNS hiccups. All worth another try, a bounded number
	// of times.
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, context.DeadlineExceeded) {
		return true, nil
	}
	return true, nil
}

// Retry policy: exponential back-off with jitter, bounded in attempts per request.
type retryPolicy struct {
	Attempts int
	Base     time.Duration
	Max      time.Duration
}

var defaultRetry = retryPolicy{Attempts: 10, Base: 200 * time.Millisecond, Max: 10 * time.Second}

// backoff is the wait before retry number attempt (0-based): Base*2^attempt capped
// at Max, of which a random half is taken off ("equal jitter") so that parts failed
// together do not come back together.
func (p retryPolicy) backoff(attempt int, rnd func() float64) time.Duration {
	d := p.Base
	for i := 0; i < attempt && d < p.Max; i++ {
		d *= 2
	}
	if d > p.Max {
		d = p.Max
	}
	return d/2 + time.Duration(rnd()*float64(d/2))
}

// do runs op until it succeeds, fails permanently, runs out of attempts, or ctx ends.
// onRetry is told of each retried error.
func (p retryPolicy) do(ctx context.Context, op func(ctx context.Context) error, onRetry func(error, time.Duration)) error {
	var last error
	for attempt := 0; attempt < p.Attempts; attempt++ {
		err := op(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return contextError(ctx, err)
		}
		retry, permanent := classify(err)
		if !retry {
			return permanent
		}
		last = err
		if attempt == p.Attempts-1 {
			break
		}
		wait := p.backoff(attempt, rand.Float64)
		var se *httpStatusError
		if errors.As(err, &se) {
			if asked := se.retryAfter(time.Now()); asked > maxRetryAfter {
				return &Error{Reason: loadspec.ReasonTransient, Err: fmt.Errorf("the server asked to wait %s before retrying, more than the %s the loader waits: %w", asked, maxRetryAfter, err)}
			} else if asked > wait {
				wait = asked
			}
		}
		if onRetry != nil {
			onRetry(err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return contextError(ctx, err)
		case <-t.C:
		}
	}
	return &Error{Reason: loadspec.ReasonTransient, Err: errors.New("gave up after " + strconv.Itoa(p.Attempts) + " attempts: " + last.Error())}
}

// contextError explains an attempt cut short by the run's own context.
func contextError(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &Error{Reason: loadspec.ReasonTimeout, Err: errors.New("the load did not finish within its timeout")}
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return &Error{Reason: loadspec.ReasonTransient, Err: errors.New("interrupted")}
}
