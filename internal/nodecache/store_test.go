package nodecache

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// fakeMounter records mounts instead of making them: the unit tests run
// without privileges. The bind mounts themselves run on the real node's tests
// (test/e2e TestRealNodeModelCache*).
type fakeMounter struct{ mounted map[string]string }

func (f *fakeMounter) Bind(source, target string) error { f.mounted[target] = source; return nil }
func (f *fakeMounter) Unmount(target string) error      { delete(f.mounted, target); return nil }
func (f *fakeMounter) IsMounted(target string) (bool, error) {
	_, ok := f.mounted[target]
	return ok, nil
}

type testStore struct {
	*Store
	t     *testing.T
	m     *fakeMounter
	clock time.Time
}

func newTestStore(t *testing.T, budget int64) *testStore {
	ts := &testStore{t: t, m: &fakeMounter{mounted: map[string]string{}}, clock: time.Unix(1e9, 0)}
	ts.Store = &Store{Root: t.TempDir(), Budget: budget, UID: os.Getuid(), GID: os.Getgid(), Mounter: ts.m}
	ts.Store.now = func() time.Time { return ts.clock }
	if err := ts.Open(); err != nil {
		t.Fatal(err)
	}
	return ts
}

// publish mounts model's volume id for a pod of ns and returns the outcome.
func (ts *testStore) publish(id, ns, model string, size int64) Published {
	ts.t.Helper()
	ts.clock = ts.clock.Add(time.Minute)
	p, err := ts.Publish(Request{VolumeID: id, Target: filepath.Join(ts.Root, "pods", id), Namespace: ns, Pod: id, Source: "s3://bucket/" + model, SizeBytes: size})
	if err != nil {
		ts.t.Fatal(err)
	}
	return p
}

func (ts *testStore) unpublish(id string) {
	ts.t.Helper()
	ts.clock = ts.clock.Add(time.Minute)
	if err := ts.Unpublish(id, filepath.Join(ts.Root, "pods", id)); err != nil {
		ts.t.Fatal(err)
	}
}

// load writes size bytes into the volume's folder and, done, the marker, as a
// loader does.
func (ts *testStore) load(id string, size int, done bool) {
	ts.t.Helper()
	dir := ts.m.mounted[filepath.Join(ts.Root, "pods", id)]
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), make([]byte, size), 0o644); err != nil {
		ts.t.Fatal(err)
	}
	if done {
		if err := os.WriteFile(filepath.Join(dir, loadspec.CompleteMarker), nil, 0o644); err != nil {
			ts.t.Fatal(err)
		}
	}
}

func keysOf(entries []nodecachespec.Entry) string {
	var ks []string
	for _, e := range entries {
		ks = append(ks, strings.TrimPrefix(e.Source, "s3://bucket/"))
	}
	return strings.Join(ks, ",")
}

func TestOneCopyPerModelAndNamespace(t *testing.T) {
	ts := newTestStore(t, 0)
	if got := ts.publish("a1", "team-a", "llama", 100).Outcome; got != OutcomeNew {
		t.Fatalf("first pod: %s, want New", got)
	}
	if got := ts.publish("a2", "team-a", "llama", 100).Outcome; got != OutcomeShared {
		t.Fatalf("second pod while the first loads: %s, want Shared", got)
	}
	ts.load("a1", 100, true)
	if got := ts.publish("a3", "team-a", "llama", 100); got.Outcome != OutcomeComplete || got.HitBytes < 100 {
		t.Fatalf("third pod: %s with %d bytes, want Complete with the copy's 100 or more", got.Outcome, got.HitBytes)
	}
	if ts.m.mounted[filepath.Join(ts.Root, "pods", "a1")] != ts.m.mounted[filepath.Join(ts.Root, "pods", "a3")] {
		t.Fatal("pods of one model and namespace got different folders")
	}
	// Another namespace never shares (nor can write) team-a's copy.
	if got := ts.publish("b1", "team-b", "llama", 100).Outcome; got != OutcomeNew {
		t.Fatalf("another namespace's pod: %s, want New", got)
	}
	// The kubelet retrying a publish changes nothing.
	if got := ts.publish("a3", "team-a", "llama", 100).Outcome; got != OutcomeComplete {
		t.Fatalf("a retried publish: %s", got)
	}
	entries, _ := ts.Entries()
	if len(entries) != 2 || entries[0].Pods+entries[1].Pods != 4 {
		t.Fatalf("entries %+v, want 2 copies used by 4 pods", entries)
	}
}

func TestEvictionIsLeastRecentlyUsedAndNeverInUse(t *testing.T) {
	ts := newTestStore(t, 330)
	for _, m := range []string{"old", "mid", "busy"} {
		ts.publish(m, "ns", m, 80)
		ts.load(m, 80, true)
	}
	ts.unpublish("old")
	ts.unpublish("mid") // busy stays mounted
	// 240 of 330 used: a 100-byte model needs one copy out, the least recently used.
	p := ts.publish("new", "ns", "new", 100)
	if p.Outcome != OutcomeNew || keysOf(p.Evicted) != "old" {
		t.Fatalf("publish: %s, evicted %q; want New, evicting old", p.Outcome, keysOf(p.Evicted))
	}
	ts.load("new", 100, true)
	// 260 used: a 200-byte model cannot fit even with every idle copy (mid) out,
	// since busy and new are mounted, so nothing is evicted.
	p = ts.publish("huge", "ns", "huge", 200)
	if p.Outcome != OutcomeOverBudget || len(p.Evicted) != 0 {
		t.Fatalf("publish: %s, evicted %q; want OverBudget, nothing evicted", p.Outcome, keysOf(p.Evicted))
	}
	entries, _ := ts.Entries()
	if got := keysOf(entries); got != "busy,mid,new" {
		t.Fatalf("copies %q, want busy,mid,new (by last mount or unmount)", got)
	}
	// The over-budget pod's own folder goes with it.
	scratch := ts.m.mounted[filepath.Join(ts.Root, "pods", "huge")]
	ts.unpublish("huge")
	if _, err := os.Stat(scratch); !os.IsNotExist(err) {
		t.Fatalf("the scratch folder %s is still there", scratch)
	}
}

func TestARestartForgetsVolumesNoLongerMounted(t *testing.T) {
	ts := newTestStore(t, 100)
	ts.publish("gone", "ns", "a", 60)
	ts.load("gone", 60, true)
	ts.publish("kept", "ns", "b", 30)
	ts.load("kept", 30, true)
	// The node restarted: its mounts are gone, the records are not.
	delete(ts.m.mounted, filepath.Join(ts.Root, "pods", "gone"))
	if err := ts.Open(); err != nil {
		t.Fatal(err)
	}
	p := ts.publish("c", "ns", "c", 60)
	if keysOf(p.Evicted) != "a" {
		t.Fatalf("evicted %q; want a, whose pod is gone, and never b, still mounted", keysOf(p.Evicted))
	}
}
