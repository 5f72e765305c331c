package loader

import (
	"encoding/json"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/testutil"
)

// TestProgressEndpoint: the board serves the attempt's progress as JSON and as
// metrics that promtool accepts; after a load it says done with every byte.
func TestProgressEndpoint(t *testing.T) {
	board := &ProgressBoard{}
	srv := httptest.NewServer(board.Handler())
	defer srv.Close()
	get := func(path string) string {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return b.String()
	}
	var p loadspec.Progress
	if err := json.Unmarshal([]byte(get(loadspec.ProgressPath)), &p); err != nil || p.Stage != "waiting" {
		t.Fatalf("before a load: %+v %v", p, err)
	}

	src, files := smallTree(t)
	o := localOptions("file://"+src, filepath.Join(t.TempDir(), "model"))
	o.Progress = board
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(get(loadspec.ProgressPath)), &p); err != nil {
		t.Fatal(err)
	}
	if p.Stage != "done" || p.Bytes != s.Bytes || p.Total != s.Bytes || p.Files != len(files)+1 || p.FilesDone != p.Files || p.ETASeconds != 0 || p.Fetched != s.BytesFetched {
		t.Errorf("after the load: %+v (summary %+v)", p, s)
	}

	metrics := get("/metrics")
	if !strings.Contains(metrics, "model_loader_total_bytes ") {
		t.Errorf("metrics: %s", metrics)
	}
	promtool := testutil.NeedPromtool(t)
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(metrics)
	if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
