package loader

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

func TestRefusalOf(t *testing.T) {
	until := "; not downloading again until the spec changes or a retry is requested"
	checksum := &loadspec.Failure{Reason: loadspec.ReasonChecksumMismatch, Message: "ChecksumMismatch: a.bin: sha256 ab, want cd"}
	reset := &loadspec.Failure{Reason: loadspec.ReasonTransient, Message: "connection reset", Retryable: true}
	for _, tc := range []struct {
		name     string
		budget   loadspec.Budget
		attempts loadspec.Attempts
		want     string
	}{
		{"first attempt", loadspec.Budget{MaxAttempts: 3}, loadspec.Attempts{}, ""},
		{"halted", loadspec.Budget{MaxAttempts: 3, Halt: &loadspec.Failure{Reason: loadspec.ReasonAccessDenied, Message: "the bucket refused"}},
			loadspec.Attempts{}, "not downloading: AccessDenied: the bucket refused"},
		{"halted on a loader's failure", loadspec.Budget{Halt: checksum}, loadspec.Attempts{},
			"not downloading: ChecksumMismatch: a.bin: sha256 ab, want cd"},
		{"an earlier permanent failure", loadspec.Budget{MaxAttempts: 3}, loadspec.Attempts{Failed: 1, LastFailure: checksum},
			"an earlier attempt failed with ChecksumMismatch: a.bin: sha256 ab, want cd" + until},
		{"attempts left", loadspec.Budget{MaxAttempts: 3}, loadspec.Attempts{Failed: 2, LastFailure: reset}, ""},
		{"attempts spent", loadspec.Budget{MaxAttempts: 3}, loadspec.Attempts{Failed: 3, LastFailure: reset},
			"this pod spent its 3 attempts, the last failed with TransientError: connection reset" + until},
		{"no bound on attempts", loadspec.Budget{}, loadspec.Attempts{Failed: 50, LastFailure: reset}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusalOf(tc.budget, tc.attempts); got != tc.want {
				t.Errorf("refusal %q\nwant    %q", got, tc.want)
			}
		})
	}
}

func TestParseArgsBudget(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, loadspec.ConfigFileName)
	os.WriteFile(cfg, []byte(`{"source":"s3://b/m","dest":"/x"}`), 0o644)
	parse := func(args ...string) (*loadspec.Budget, error) {
		o, err := ParseArgs(append([]string{"--config", cfg}, args...), io.Discard)
		return o.Budget, err
	}
	if b, err := parse(); b != nil || err != nil {
		t.Errorf("no budget file: budget %+v, %v; want none", b, err)
	}
	os.WriteFile(filepath.Join(dir, loadspec.BudgetFileName), []byte(`{"epoch":"e1","maxAttempts":3,"backoff":"10s"}`), 0o644)
	want := loadspec.Budget{Epoch: "e1", MaxAttempts: 3, Backoff: loadspec.Duration{Duration: 10 * time.Second}}
	if b, err := parse(); err != nil || b == nil || !reflect.DeepEqual(*b, want) {
		t.Errorf("budget beside the config: %+v, %v; want %+v", b, err, want)
	}
	other := filepath.Join(t.TempDir(), "other.json")
	os.WriteFile(other, []byte(`{"epoch":"e2","halt":{"reason":"AccessDenied","message":"no"}}`), 0o644)
	if b, err := parse("--budget", other); err != nil || b == nil || b.Epoch != "e2" || b.Halt == nil {
		t.Errorf("--budget: %+v, %v; want epoch e2, halted", b, err)
	}
	if _, err := parse("--budget", filepath.Join(dir, "missing.json")); ExitCode(err) != loadspec.ExitInvalidConfig {
		t.Errorf("an explicit missing budget file: %v", err)
	}
	for _, bad := range []string{`{"maxAttempts":"3"}`, `{"maxAttempts":-1}`, `{"backoff":"-1s"}`} {
		os.WriteFile(filepath.Join(dir, loadspec.BudgetFileName), []byte(bad), 0o644)
		if _, err := parse(); ExitCode(err) != loadspec.ExitInvalidConfig {
			t.Errorf("budget %s: %v; want invalid configuration", bad, err)
		}
	}
}

func TestAttemptRecord(t *testing.T) {
	if got, want := attemptsPath("/models/llama/"), "/models/llama"+loadspec.AttemptsFileSuffix; got != want {
		t.Errorf("record of a destination with a trailing slash at %s, want %s beside it", got, want)
	}
	log := testLogger(t)
	path := attemptsPath(filepath.Join(t.TempDir(), "cache", "model"))
	a := loadspec.Attempts{Epoch: "e1", Failed: 2, LastTime: time.Now().UTC().Round(time.Millisecond),
		LastFailure: &loadspec.Failure{Reason: loadspec.ReasonTimeout, Message: "slow", Retryable: true}}
	if err := writeAttempts(path, a, false); err != nil {
		t.Fatal(err)
	}
	if got := readAttempts(path, "e1", log); !reflect.DeepEqual(got, a) {
		t.Errorf("read back %+v, want %+v", got, a)
	}
	if got := readAttempts(path, "e2", log); !reflect.DeepEqual(got, loadspec.Attempts{Epoch: "e2"}) {
		t.Errorf("record of another epoch read as %+v; want no attempt", got)
	}
	os.WriteFile(path, []byte(`{"epoch":"e1","fail`), 0o644)
	if got := readAttempts(path, "e1", log); got.Failed != 0 {
		t.Errorf("torn record read as %+v; want no attempt", got)
	}
}

// The tests below run the loader through a fault proxy in front of the S3 server,
// which notes every request it passes.

// uploadSmallModel puts two files of 64 KiB under prefix and returns the source.
func uploadSmallModel(t *testing.T, prefix string) string {
	t.Helper()
	for i, name := range []string{"config.json", "model.safetensors"} {
		writeAndUpload(t, prefix+"/"+name, strings.Repeat(string(rune('a'+i)), 64<<10))
	}
	return "s3://" + bucket + "/" + prefix
}

func budgetedOptions(source, dest string, proxy *faultProxy, b loadspec.Budget) Options {
	o := testOptions(source, dest)
	o.S3.Endpoint = proxy.URL()
	o.Budget = &b
	return o
}

// readRecord returns the attempt record beside dest, if there is one.
func readRecord(t *testing.T, dest string) (loadspec.Attempts, bool) {
	t.Helper()
	data, err := os.ReadFile(attemptsPath(dest))
	if isNotExist(err) {
		return loadspec.Attempts{}, false
	}
	var a loadspec.Attempts
	if err == nil {
		err = json.Unmarshal(data, &a)
	}
	if err != nil {
		t.Fatal(err)
	}
	return a, true
}

// runCounting runs the loader in process and returns how many requests reached the store.
func runCounting(t *testing.T, ctx context.Context, proxy *faultProxy, o Options) (loadspec.Summary, int, error) {
	t.Helper()
	before := len(proxy.requests())
	s, err := Run(ctx, o, testLogger(t))
	return s, len(proxy.requests()) - before, err
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testLogWriter{t}, nil))
}

func TestHaltedBudgetMakesNoRequest(t *testing.T) {
	needServer(t)
	proxy := newFaultProxy(srv.Endpoint, nil)
	defer proxy.Close()
	halt := loadspec.Failure{Reason: loadspec.ReasonChecksumMismatch, Message: "ChecksumMismatch: model.safetensors: sha256 ab, want cd"}
	budget, _ := json.Marshal(loadspec.Budget{Epoch: "e1", MaxAttempts: 3, Backoff: loadspec.Duration{Duration: time.Second}, Halt: &halt})
	for _, tc := range []struct {
		name       string
		budgetPath func(configDir string) string
		args       []string
	}{
		{"budget beside the config", func(dir string) string { return filepath.Join(dir, loadspec.BudgetFileName) }, nil},
		{"--budget", func(dir string) string { return filepath.Join(dir, "another-name.json") }, []string{"--budget"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			dest := filepath.Join(dir, "cache", "model")
			cfg, _ := json.Marshal(loadspec.Config{Source: "s3://models/mp/llama", Dest: dest,
				S3: &loadspec.S3Options{Endpoint: proxy.URL(), Region: "us-east-1", PathStyle: true}})
			cfgPath := filepath.Join(dir, loadspec.ConfigFileName)
			os.WriteFile(cfgPath, cfg, 0o644)
			budgetPath := tc.budgetPath(dir)
			os.WriteFile(budgetPath, budget, 0o644)
			args := []string{"--config", cfgPath}
			if tc.args != nil {
				args = append(args, append(tc.args, budgetPath)...)
			}

			code, s, out := runBinary(t, nil, args...)
			if code != loadspec.ExitHalted {
				t.Fatalf("exit %d, want %d:\n%s", code, loadspec.ExitHalted, out)
			}
			want := loadspec.Failure{Reason: loadspec.ReasonHalted, Message: "not downloading: " + halt.Message}
			if s.Failure == nil || *s.Failure != want {
				t.Errorf("failure %+v, want %+v", s.Failure, want)
			}
			if n := len(proxy.requests()); n != 0 {
				t.Errorf("the store saw %d requests; a halted loader makes none", n)
			}
			if _, ok := readRecord(t, dest); ok {
				t.Error("a halted run wrote an attempt record")
			}
		})
	}
}

func TestPermanentFailureIsNotTriedAgain(t *testing.T) {
	needServer(t)
	proxy := newFaultProxy(srv.Endpoint, nil)
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	o := budgetedOptions("s3://models/no/such/model", dest, proxy, loadspec.Budget{Epoch: "e1", MaxAttempts: 5})

	_, n, err := runCounting(t, context.Background(), proxy, o)
	if ExitCode(err) != loadspec.ExitNotFound || n == 0 {
		t.Fatalf("first run: %v after %d requests; want NotFound from the store", err, n)
	}
	rec, ok := readRecord(t, dest)
	if !ok || rec.Epoch != "e1" || rec.Failed != 1 || rec.LastFailure == nil ||
		rec.LastFailure.Reason != loadspec.ReasonNotFound || rec.LastFailure.Retryable || time.Since(rec.LastTime) > time.Minute {
		t.Fatalf("record after the first run: %+v", rec)
	}

	s, n, err := runCounting(t, context.Background(), proxy, o)
	if ExitCode(err) != loadspec.ExitHalted || n != 0 {
		t.Errorf("second run: exit %d after %d requests; want %d and none", ExitCode(err), n, loadspec.ExitHalted)
	}
	if s.Failure == nil || s.Failure.Reason != loadspec.ReasonHalted || s.Failure.Retryable ||
		!strings.HasPrefix(s.Failure.Message, "an earlier attempt failed with SourceNotFound: ") {
		t.Errorf("second run's failure %+v", s.Failure)
	}
	if s.Attempts == nil || !reflect.DeepEqual(*s.Attempts, rec) {
		t.Errorf("second run's summary carries the attempts %+v; want the record %+v", s.Attempts, rec)
	}
	if again, _ := readRecord(t, dest); !reflect.DeepEqual(again, rec) {
		t.Errorf("a refused run changed the record: %+v, was %+v", again, rec)
	}
}

// stallingProxy stalls every ranged GET, so that a run fails with a (retryable)
// timeout once it has listed the source.
func stallingProxy() *faultProxy {
	return newFaultProxy(srv.Endpoint, func(int) fault { return stallBody })
}

func TestRetryableFailuresSpendTheAttempts(t *testing.T) {
	needServer(t)
	source := uploadSmallModel(t, "budget/spend")
	proxy := stallingProxy()
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	o := budgetedOptions(source, dest, proxy, loadspec.Budget{Epoch: "e1", MaxAttempts: 2})
	o.Timeout.Duration = 500 * time.Millisecond
	for attempt := 1; attempt <= 2; attempt++ {
		s, n, err := runCounting(t, context.Background(), proxy, o)
		if ExitCode(err) != loadspec.ExitRetryable || n == 0 {
			t.Fatalf("attempt %d: %v after %d requests; want a retryable failure from the store", attempt, err, n)
		}
		if rec, _ := readRecord(t, dest); rec.Failed != attempt || !reflect.DeepEqual(rec.LastFailure, s.Failure) {
			t.Fatalf("record after attempt %d: %+v; want %d failed, the last %+v", attempt, rec, attempt, s.Failure)
		}
	}
	s, n, err := runCounting(t, context.Background(), proxy, o)
	if ExitCode(err) != loadspec.ExitHalted || n != 0 {
		t.Fatalf("third run: %v after %d requests; want refused without a request", err, n)
	}
	if !strings.HasPrefix(s.Failure.Message, "this pod spent its 2 attempts, the last failed with Timeout: ") {
		t.Errorf("third run's failure %+v", s.Failure)
	}
}

func TestBackoffBeforeTheNextAttempt(t *testing.T) {
	needServer(t)
	source := uploadSmallModel(t, "budget/backoff")
	proxy := stallingProxy()
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	backoff := 500 * time.Millisecond
	o := budgetedOptions(source, dest, proxy, loadspec.Budget{Epoch: "e1", Backoff: loadspec.Duration{Duration: backoff}})
	// A timeout shorter than the back-off: the wait must not count against it.
	o.Timeout.Duration = 300 * time.Millisecond
	if _, err := Run(context.Background(), o, testLogger(t)); ExitCode(err) != loadspec.ExitRetryable {
		t.Fatalf("first run: %v; want a retryable failure", err)
	}
	first, _ := readRecord(t, dest)

	before := len(proxy.requests())
	if _, err := Run(context.Background(), o, testLogger(t)); ExitCode(err) != loadspec.ExitRetryable {
		t.Fatalf("second run: %v; want a retryable failure", err)
	}
	reqs := proxy.requests()[before:]
	if len(reqs) == 0 {
		t.Fatal("the second run made no request: the wait used up its timeout")
	}
	if earliest := first.LastTime.Add(backoff); reqs[0].Before(earliest) {
		t.Errorf("the second run reached the store %s after the first failed; want the back-off, %s, first",
			reqs[0].Sub(first.LastTime), backoff)
	}
	second, _ := readRecord(t, dest)
	if second.Failed != 2 {
		t.Fatalf("record after two failures: %+v", second)
	}

	// The third run waits twice the back-off; a signal ends the wait at once.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, n, err := runCounting(t, ctx, proxy, o)
	if took := time.Since(start); took > time.Second || n != 0 || ExitCode(err) != loadspec.ExitRetryable {
		t.Errorf("interrupted wait: %v after %s and %d requests; want a retryable failure at once, without a request", err, took, n)
	}
	if rec, _ := readRecord(t, dest); !reflect.DeepEqual(rec, second) {
		t.Errorf("an interrupted wait changed the record: %+v, was %+v", rec, second)
	}
}

func TestRecordOfAnotherEpochIsIgnored(t *testing.T) {
	needServer(t)
	source := uploadSmallModel(t, "budget/epoch")
	proxy := newFaultProxy(srv.Endpoint, nil)
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	old := loadspec.Attempts{Epoch: "old", Failed: 9, LastTime: time.Now().UTC(),
		LastFailure: &loadspec.Failure{Reason: loadspec.ReasonAccessDenied, Message: "denied"}}
	if err := writeAttempts(attemptsPath(dest), old, false); err != nil {
		t.Fatal(err)
	}
	o := budgetedOptions(source, dest, proxy, loadspec.Budget{Epoch: "new", MaxAttempts: 1, Backoff: loadspec.Duration{Duration: time.Hour}})
	if s, err := runInProcess(t, o); err != nil || s.Files != 2 || s.CacheHit {
		t.Fatalf("run of a new epoch: %+v, %v; want the model downloaded", s, err)
	}
	if rec, ok := readRecord(t, dest); ok {
		t.Errorf("a successful run left the record %+v", rec)
	}
}

func TestSuccessRemovesTheRecord(t *testing.T) {
	needServer(t)
	source := uploadSmallModel(t, "budget/success")
	proxy := newFaultProxy(srv.Endpoint, nil)
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	earlier := loadspec.Attempts{Epoch: "e1", Failed: 1, LastTime: time.Now().Add(-time.Hour).UTC(),
		LastFailure: &loadspec.Failure{Reason: loadspec.ReasonTransient, Message: "reset", Retryable: true}}
	if err := writeAttempts(attemptsPath(dest), earlier, false); err != nil {
		t.Fatal(err)
	}
	o := budgetedOptions(source, dest, proxy, loadspec.Budget{Epoch: "e1", MaxAttempts: 2, Backoff: loadspec.Duration{Duration: time.Second}})
	if s, err := runInProcess(t, o); err != nil || s.Files != 2 {
		t.Fatalf("second attempt: %+v, %v; want the model downloaded", s, err)
	}
	if rec, ok := readRecord(t, dest); ok {
		t.Errorf("a successful run left the record %+v", rec)
	}
	entries, _ := os.ReadDir(filepath.Dir(dest))
	if len(entries) != 1 {
		t.Errorf("beside the destination: %v; want only the model folder", entries)
	}
}

func TestCacheHitWinsOverTheBudget(t *testing.T) {
	needServer(t)
	source := uploadSmallModel(t, "budget/cached")
	proxy := newFaultProxy(srv.Endpoint, nil)
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	if _, err := runInProcess(t, testOptions(source, dest)); err != nil {
		t.Fatal(err)
	}
	checksum := &loadspec.Failure{Reason: loadspec.ReasonChecksumMismatch, Message: "ChecksumMismatch: x"}
	reset := &loadspec.Failure{Reason: loadspec.ReasonTransient, Message: "reset", Retryable: true}
	for _, tc := range []struct {
		name   string
		budget loadspec.Budget
		record *loadspec.Attempts
	}{
		{"halted", loadspec.Budget{Epoch: "e1", Halt: checksum}, nil},
		{"an earlier permanent failure", loadspec.Budget{Epoch: "e1", MaxAttempts: 3},
			&loadspec.Attempts{Epoch: "e1", Failed: 1, LastFailure: checksum, LastTime: time.Now()}},
		{"attempts spent", loadspec.Budget{Epoch: "e1", MaxAttempts: 1},
			&loadspec.Attempts{Epoch: "e1", Failed: 1, LastFailure: reset, LastTime: time.Now()}},
		{"a back-off not yet over", loadspec.Budget{Epoch: "e1", Backoff: loadspec.Duration{Duration: time.Hour}},
			&loadspec.Attempts{Epoch: "e1", Failed: 1, LastFailure: reset, LastTime: time.Now()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.record != nil {
				if err := writeAttempts(attemptsPath(dest), *tc.record, false); err != nil {
					t.Fatal(err)
				}
			}
			// Bounded, so that a loader that waits out the back-off fails here at once.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			s, n, err := runCounting(t, ctx, proxy, budgetedOptions(source, dest, proxy, tc.budget))
			if err != nil || !s.CacheHit || s.Files != 2 || s.Bytes != 2*64<<10 || !s.Verified || n != 0 {
				t.Errorf("%+v, %v after %d requests; want a cache hit without a request", s, err, n)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("a cache hit took %s", took)
			}
			if rec, ok := readRecord(t, dest); ok {
				t.Errorf("a cache hit left the record %+v", rec)
			}
		})
	}
}

func TestInterruptedAttemptIsNotCounted(t *testing.T) {
	needServer(t)
	source := uploadSmallModel(t, "budget/interrupted")
	proxy := stallingProxy()
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, n, err := runCounting(t, ctx, proxy, budgetedOptions(source, dest, proxy, loadspec.Budget{Epoch: "e1", MaxAttempts: 1}))
	if ExitCode(err) != loadspec.ExitRetryable || n == 0 {
		t.Fatalf("%v after %d requests; want an interrupted download", err, n)
	}
	if rec, ok := readRecord(t, dest); ok {
		t.Errorf("a run stopped by a signal was counted: %+v", rec)
	}
}

func TestUnwritableRecordKeepsTheFailure(t *testing.T) {
	needServer(t)
	proxy := newFaultProxy(srv.Endpoint, nil)
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	// A folder where the record goes: it cannot be replaced by a file.
	if err := os.MkdirAll(attemptsPath(dest), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := runInProcess(t, budgetedOptions("s3://models/no/such/model", dest, proxy, loadspec.Budget{Epoch: "e1"}))
	if ExitCode(err) != loadspec.ExitNotFound || s.Failure == nil || s.Failure.Reason != loadspec.ReasonNotFound {
		t.Errorf("%v, failure %+v; want the store's NotFound", err, s.Failure)
	}
}
