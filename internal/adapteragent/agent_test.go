package adapteragent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/autoscale"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/testutil"
)

const baseModel = "adapter-test-base"

// startSim runs llm-d-inference-sim as the engine (vLLM's adapter API:
// load, unload, /v1/models with each adapter's path) on port, and stops it
// when the test ends or stop is called.
func startSim(t *testing.T, port int) (stop func()) {
	t.Helper()
	dir, err := testutil.BuildTools("sim")
	if err != nil {
		t.Fatalf("llm-d-inference-sim: %v", err)
	}
	cmd := exec.Command(filepath.Join(dir, "llm-d-inference-sim"), "--model", baseModel, "--port", strconv.Itoa(port),
		"--max-loras", "4", "--max-cpu-loras", "4", "--mode", "echo", "--time-to-first-token", "1ms")
	logs := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop = func() {
		_ = cmd.Process.Kill()
		<-done
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				return stop
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the simulator did not answer /health in 60 s: %v\n%s", err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// writeAdapter writes an adapter's files (a config and random weights) and
// their sha256 manifest into dir/name, and returns the folder.
func writeAdapter(t *testing.T, dir, name string, size int) string {
	t.Helper()
	src := filepath.Join(dir, name)
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	weights := make([]byte, size)
	_, _ = rand.Read(weights)
	files := map[string][]byte{
		"adapter_config.json":       []byte(`{"r": 8, "lora_alpha": 16, "base_model_name_or_path": "` + baseModel + `"}`),
		"adapter_model.safetensors": weights,
	}
	var manifest bytes.Buffer
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		if err := os.WriteFile(filepath.Join(src, f), files[f], 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(files[f])
		fmt.Fprintf(&manifest, "%s  %s\n", hex.EncodeToString(sum[:]), f)
	}
	if err := os.WriteFile(filepath.Join(src, "SHA256SUMS"), manifest.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}

func adapterFrom(name, src, adaptersDir string) loadspec.Adapter {
	return loadspec.Adapter{Name: name, Load: loadspec.Config{
		Source: "file://" + src, Dest: filepath.Join(adaptersDir, name+"-1"), SHA256Manifest: "SHA256SUMS",
		Timeout: loadspec.Duration{Duration: time.Minute},
	}}
}

// engineAdapters are the adapters the engine lists, with their paths.
func engineAdapters(t *testing.T, port int) map[string]string {
	t.Helper()
	got, err := newVLLMAPI(fmt.Sprintf("http://127.0.0.1:%d", port)).loaded(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func stateOf(a *Agent, name string) loadspec.AdapterReplica {
	for _, r := range a.Report().Adapters {
		if r.Name == name {
			return r
		}
	}
	return loadspec.AdapterReplica{}
}

// checkFilesWhereTheEngineLooks: the simulator does not read an adapter's
// files, vLLM does; so the folder the engine was told to load must hold the
// source's files, whole, verified against the manifest.
func checkFilesWhereTheEngineLooks(t *testing.T, enginePath, src string) {
	t.Helper()
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		want, _ := os.ReadFile(filepath.Join(src, f))
		got, err := os.ReadFile(filepath.Join(enginePath, f))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s in the folder the engine loads (%s): %d bytes, err %v; want the source's %d bytes", f, enginePath, len(got), err, len(want))
		}
	}
	var marker struct {
		Files []struct {
			Path, Check string
		} `json:"files"`
	}
	data, err := os.ReadFile(filepath.Join(enginePath, loadspec.CompleteMarker))
	if err != nil || json.Unmarshal(data, &marker) != nil {
		t.Fatalf("no complete marker in %s: %v", enginePath, err)
	}
	for _, f := range marker.Files {
		if f.Path == "SHA256SUMS" {
			continue // the manifest itself, which nothing vouches for
		}
		if f.Check != "sha256" {
			t.Errorf("%s was checked by %q, want sha256 (the manifest)", f.Path, f.Check)
		}
	}
}

// TestAgentLoadsAndUnloadsAdaptersInARunningEngine runs the agent against the
// simulator with the real loader: adapters of the start set load, an adapter
// added later loads without a restart, one removed is unloaded, a missing
// source fails without touching the others (not retried: permanent), an
// engine restarted in place gets its adapters back, and only a PUT with the
// token changes the set.
func TestAgentLoadsAndUnloadsAdaptersInARunningEngine(t *testing.T) {
	port := freePort(t)
	stop := startSim(t, port)
	srcDir, cache := t.TempDir(), t.TempDir()
	adaptersDir := filepath.Join(cache, loadspec.AdaptersDir)
	sql, chat := writeAdapter(t, srcDir, "sql", 3<<20), writeAdapter(t, srcDir, "chat", 1<<20)
	fetch := func(ctx context.Context, cfg loadspec.Config) (loadspec.Summary, error) {
		o, err := loader.DefaultOptions().AdapterOptions(cfg)
		if err != nil {
			return loadspec.Summary{}, err
		}
		return loader.Run(ctx, o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	set := loadspec.AdapterSet{Revision: "1", MaxAttempts: 3, Backoff: loadspec.Duration{Duration: time.Second},
		Adapters: []loadspec.Adapter{adapterFrom("sql", sql, adaptersDir)}}
	agent, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)), fmt.Sprintf("http://127.0.0.1:%d", port), adaptersDir, set, fetch)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go agent.Run(ctx)
	srv := httptest.NewServer(agent.Handler("the-token"))
	defer srv.Close()

	waitFor(t, "sql loaded", func() bool { return stateOf(agent, "sql").State == string(servingv1.AdapterLoaded) })
	if !agent.Ready() {
		t.Error("not ready once the start set is loaded")
	}
	checkFilesWhereTheEngineLooks(t, engineAdapters(t, port)["sql"], sql)

	// A set from someone without the token is refused.
	put := func(token string, set loadspec.AdapterSet) int {
		body, _ := json.Marshal(set)
		req, _ := http.NewRequest(http.MethodPut, srv.URL+loadspec.AdaptersPath, bytes.NewReader(body))
		req.Header.Set(loadspec.AdapterTokenHeader, token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	evil := set
	evil.Adapters = []loadspec.Adapter{{Name: "x", Load: loadspec.Config{Source: "file:///etc", Dest: "/etc/cron.d"}}}
	if code := put("guess", evil); code != http.StatusForbidden {
		t.Errorf("a PUT without the token answered %d, want 403", code)
	}
	if code := put("the-token", evil); code != http.StatusBadRequest {
		t.Errorf("a PUT writing outside the adapter folder answered %d, want 400", code)
	}

	// Added at run time: loaded into the running engine.
	added := time.Now()
	set.Revision, set.Adapters = "2", append(set.Adapters, adapterFrom("chat", chat, adaptersDir), adapterFrom("gone", filepath.Join(srcDir, "missing"), adaptersDir))
	if code := put("the-token", set); code != http.StatusOK {
		t.Fatalf("PUT answered %d", code)
	}
	waitFor(t, "chat loaded", func() bool { return stateOf(agent, "chat").State == string(servingv1.AdapterLoaded) })
	t.Logf("an adapter added to a running engine served %s after the set arrived", time.Since(added).Round(time.Millisecond))
	checkFilesWhereTheEngineLooks(t, engineAdapters(t, port)["chat"], chat)
	waitFor(t, "gone failed", func() bool { return stateOf(agent, "gone").State == string(servingv1.AdapterFailed) })
	if f := stateOf(agent, "gone"); f.Failure.Reason != loadspec.ReasonNotFound || f.Retrying {
		t.Errorf("a missing source: %+v, want SourceNotFound and no retry", f)
	}
	if _, ok := engineAdapters(t, port)["gone"]; ok {
		t.Error("the engine was asked to load an adapter whose files failed")
	}

	// The base model and the adapters answer.
	for _, model := range []string{baseModel, "sql", "chat"} {
		body := fmt.Sprintf(`{"model": %q, "prompt": "hi", "max_tokens": 1}`, model)
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/completions", port), "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("a completion for %s answered %d", model, resp.StatusCode)
		}
	}

	// The autoscaler counts the adapters' requests with the base model's: the
	// engine's running-request gauge is the engine's, whatever model a request
	// names.
	admin := func(cfg string) {
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/admin/config", port), "application/json", bytes.NewBufferString(cfg))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	admin(`{"time-to-first-token": "3s"}`)
	for _, model := range []string{"sql", "chat", baseModel} {
		go func() {
			body := fmt.Sprintf(`{"model": %q, "prompt": "hi", "max_tokens": 1}`, model)
			if resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/completions", port), "application/json", bytes.NewBufferString(body)); err == nil {
				_ = resp.Body.Close()
			}
		}()
	}
	eng, _ := engine.For(servingv1.EngineVLLM)
	waitFor(t, "three running requests read by the autoscaler", func() bool {
		got, err := autoscale.Scrape(context.Background(), fmt.Sprintf("http://127.0.0.1:%d/metrics", port),
			[]servingv1.AutoscalingSignal{servingv1.SignalRunningRequests}, eng.SignalMetrics)
		return err == nil && got[servingv1.SignalRunningRequests] == 3
	})
	admin(`{"time-to-first-token": "1ms"}`)

	// Removed: unloaded.
	set.Revision, set.Adapters = "3", set.Adapters[1:2]
	if code := put("the-token", set); code != http.StatusOK {
		t.Fatalf("PUT answered %d", code)
	}
	waitFor(t, "sql unloaded", func() bool { _, ok := engineAdapters(t, port)["sql"]; return !ok })

	// The engine restarted in place lost its adapters: the agent loads them again.
	stop()
	startSim(t, port)
	waitFor(t, "chat loaded again", func() bool { _, ok := engineAdapters(t, port)["chat"]; return ok })
}
