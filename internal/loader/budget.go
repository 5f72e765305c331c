package loader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

// readBudget reads the operator's retry budget. A missing file is no budget,
// unless its path was given explicitly.
func readBudget(path string, explicit bool) (*loadspec.Budget, error) {
	data, err := os.ReadFile(path)
	if isNotExist(err) && !explicit {
		return nil, nil
	}
	if err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "budget file: %v", err)
	}
	var b loadspec.Budget
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "budget file %s: %v", path, err)
	}
	if b.MaxAttempts < 0 || b.Backoff.Duration < 0 {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "budget file %s: maxAttempts and backoff must not be negative", path)
	}
	return &b, nil
}

// runBudgeted runs the load within the operator's budget. The kubelet restarts a
// failed loader in place for ever, so before any request to the store the loader
// reads its attempt record and refuses (loads halted, an earlier failure that
// another attempt cannot cure, the attempts spent) or waits out the back-off; it
// records each failed attempt for the next run.
func runBudgeted(ctx context.Context, o Options, b loadspec.Budget, log *slog.Logger) (loadspec.Summary, error) {
	dest, err := filepath.Abs(o.Dest)
	if err != nil {
		err := failf(loadspec.ReasonInvalidConfig, "", "destination: %v", err)
		return loadspec.Summary{Failure: FailureOf(err)}, err
	}
	recordPath := attemptsPath(dest)
	prev := readAttempts(recordPath, b.Epoch, log)
	refusal := refusalOf(b, prev)
	var wait time.Duration
	if refusal == "" && prev.Failed > 0 {
		wait = time.Until(prev.LastTime.Add(loadspec.RetryDelay(b.Backoff.Duration, prev.Failed)))
	}
	if refusal != "" || wait > 0 {
		// Only here is the marker trusted without asking the store: a run that may
		// go ahead lists the source as always, and so sees a model changed there.
		if s, ok := completeInPlace(dest, o.Source); ok {
			log.Info("Destination already holds the complete model; not contacting the source", "dest", dest)
			forgetAttempts(recordPath, log)
			return s, nil
		}
	}
	if refusal != "" {
		err := &Error{Reason: loadspec.ReasonHalted, Err: errors.New(refusal)}
		s := loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonHalted, Message: refusal}}
		if prev.Failed > 0 {
			s.Attempts = &prev
		}
		return s, err
	}
	if wait > 0 {
		log.Info("Waiting before the next attempt", "wait", wait.Round(time.Millisecond),
			"failedAttempts", prev.Failed, "lastFailure", describe(prev.LastFailure))
		select {
		case <-ctx.Done():
			err := contextError(ctx, ctx.Err())
			return loadspec.Summary{Failure: FailureOf(err)}, err
		case <-time.After(wait):
		}
	}

	s, err := runOnce(ctx, o, log)
	switch {
	case err == nil:
		forgetAttempts(recordPath, log)
	case ctx.Err() != nil:
		// Stopped by a signal, the pod going away: not a failed attempt.
	default:
		next := loadspec.Attempts{Epoch: b.Epoch, Failed: prev.Failed + 1, LastFailure: s.Failure, LastTime: time.Now().UTC()}
		if werr := writeAttempts(recordPath, next, o.Fsync); werr != nil {
			log.Error("Could not record the failed attempt; the next run does not know of it", "path", recordPath, "error", werr.Error())
		}
	}
	return s, err
}

// attemptsPath names the attempt record of a destination: beside the folder, on
// the same volume, never inside it (a trailing slash would put it there), so it
// is no part of the model.
func attemptsPath(dest string) string {
	return filepath.Clean(dest) + loadspec.AttemptsFileSuffix
}

// readAttempts returns the record of this epoch's attempts. A record that is
// missing, unreadable or of another epoch counts as no attempt yet.
func readAttempts(path, epoch string, log *slog.Logger) loadspec.Attempts {
	none := loadspec.Attempts{Epoch: epoch}
	data, err := os.ReadFile(path)
	if err != nil {
		if !isNotExist(err) {
			log.Warn("Could not read the attempt record; counting no attempt", "path", path, "error", err.Error())
		}
		return none
	}
	var a loadspec.Attempts
	if err := json.Unmarshal(data, &a); err != nil {
		log.Warn("Unreadable attempt record; counting no attempt", "path", path, "error", err.Error())
		return none
	}
	if a.Epoch != epoch {
		return none
	}
	return a
}

func writeAttempts(path string, a loadspec.Attempts, fsync bool) error {
	data, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeFileAtomic(path, append(data, '\n'), fsync)
}

func forgetAttempts(path string, log *slog.Logger) {
	if err := os.Remove(path); err != nil && !isNotExist(err) {
		log.Warn("Could not remove the attempt record", "path", path, "error", err.Error())
	}
}

// refusalOf says why the budget forbids this run to contact the store, or "".
func refusalOf(b loadspec.Budget, a loadspec.Attempts) string {
	const until = "not downloading again until the spec changes or a retry is requested"
	switch {
	case b.Halt != nil:
		return "not downloading: " + describe(b.Halt)
	case a.LastFailure != nil && !a.LastFailure.Retryable:
		return fmt.Sprintf("an earlier attempt failed with %s; %s", describe(a.LastFailure), until)
	case b.MaxAttempts > 0 && a.Failed >= b.MaxAttempts:
		return fmt.Sprintf("this pod spent its %d attempts, the last failed with %s; %s", b.MaxAttempts, describe(a.LastFailure), until)
	}
	return ""
}

// describe names a failure by its reason and message, which for the loader's own
// failures already begins with the reason.
func describe(f *loadspec.Failure) string {
	switch {
	case f == nil:
		return "no recorded failure"
	case strings.HasPrefix(f.Message, f.Reason+":"):
		return f.Message
	}
	return f.Reason + ": " + f.Message
}

// completeInPlace tells, from the destination alone, whether it holds the
// complete model of this source: its marker names the source and every file the
// marker vouches for is there with its size. It summarises that as a cache hit.
func completeInPlace(dest, source string) (loadspec.Summary, bool) {
	m, err := readMarker(dest)
	if err != nil || m.Source != source {
		return loadspec.Summary{}, false
	}
	objs := make([]Object, len(m.Files))
	s := loadspec.Summary{Files: len(m.Files), Bytes: m.Bytes, CacheHit: true, Checks: map[string]int{}}
	for i, f := range m.Files {
		objs[i] = Object{Path: f.Path, Size: f.Size, ETag: f.ETag}
		s.Checks[f.Check]++
	}
	if !m.matches(dest, objs) {
		return loadspec.Summary{}, false
	}
	s.Verified = s.Checks[checkSize] == 0
	if len(s.Checks) == 0 {
		s.Checks = nil
	}
	return s, true
}
