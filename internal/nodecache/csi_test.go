package nodecache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// kubelet calls the plugin's CSI socket as the kubelet does for a pod's inline
// volume: the volume attributes the pod gives, plus the pod's identity
// (podInfoOnMount) and the ephemeral flag, a target under the pod's folder.
type kubelet struct {
	t     *testing.T
	node  csi.NodeClient
	store *Store
	m     *fakeMounter
}

func startPlugin(t *testing.T, budget int64) *kubelet {
	t.Helper()
	m := &fakeMounter{mounted: map[string]string{}}
	store := &Store{Root: t.TempDir(), Budget: budget, UID: os.Getuid(), GID: os.Getgid(), Mounter: m}
	if err := store.Open(); err != nil {
		t.Fatal(err)
	}
	p := &plugin{node: "node-1", store: store, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry())}
	srv := grpc.NewServer()
	csi.RegisterNodeServer(srv, p)
	csi.RegisterIdentityServer(srv, p)
	sock := filepath.Join(t.TempDir(), "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &kubelet{t: t, node: csi.NewNodeClient(conn), store: store, m: m}
}

func (k *kubelet) target(pod string) string {
	return filepath.Join(k.store.Root, "kubelet", "pods", pod, "volumes", "kubernetes.io~csi", "model-cache", "mount")
}

// publish mounts pod's volume; it returns the folder of the node the pod got.
func (k *kubelet) publish(namespace, pod string, attrs map[string]string) (string, error) {
	k.t.Helper()
	ctx := map[string]string{
		podNamespaceAttr: namespace, podNameAttr: pod, podUIDAttr: "uid-" + pod, ephemeralAttr: "true",
	}
	for a, v := range attrs {
		ctx[a] = v
	}
	_, err := k.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId:   "csi-" + pod,
		TargetPath: k.target(pod),
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		VolumeContext: ctx,
	})
	return k.m.mounted[k.target(pod)], err
}

func (k *kubelet) unpublish(pod string) {
	k.t.Helper()
	if _, err := k.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-" + pod, TargetPath: k.target(pod)}); err != nil {
		k.t.Fatal(err)
	}
}

// load runs the model loader, as the pod's init container does, into dir.
func load(t *testing.T, source, dir string) loadspec.Summary {
	t.Helper()
	o := loader.Options{
		Config: loadspec.Config{
			Source: source, Dest: dir, S3: &loadspec.S3Options{}, SHA256Manifest: "SHA256SUMS",
			Concurrency: 4, PartSizeBytes: 1 << 20,
			Timeout:      loadspec.Duration{Duration: time.Minute},
			StallTimeout: loadspec.Duration{Duration: 10 * time.Second},
		},
		ProgressInterval: time.Second,
	}
	s, err := loader.Run(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("loader: %v", err)
	}
	return s
}

// A pod of the namespace overwrites a file of the complete copy in place and
// puts its modification time back: inode, mtime and size are what the marker
// recorded. The next pod's loader must still find the change and fetch the
// file again, not serve it as verified.
func TestACopyOverwrittenInPlaceIsFetchedAgain(t *testing.T) {
	src := t.TempDir()
	weights := make([]byte, 3<<20+5)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range weights {
		weights[i] = byte(rnd.Uint32())
	}
	files := map[string][]byte{"model.safetensors": weights, "config.json": []byte(`{"layers": 2}`)}
	var sums strings.Builder
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		fmt.Fprintf(&sums, "%s  %s\n", hex.EncodeToString(s[:]), name)
	}
	if err := os.WriteFile(filepath.Join(src, "SHA256SUMS"), []byte(sums.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	store := httptest.NewServer(http.FileServer(http.Dir(src)))
	defer store.Close()
	attrs := map[string]string{nodecachespec.AttrSource: store.URL + "/", nodecachespec.AttrSizeBytes: "4000000"}

	k := startPlugin(t, 0)
	dir, err := k.publish("team-a", "first", attrs)
	if err != nil {
		t.Fatal(err)
	}
	if s := load(t, attrs[nodecachespec.AttrSource], dir); s.BytesFetched < int64(len(weights)) {
		t.Fatalf("first loader fetched %d bytes", s.BytesFetched)
	}
	k.unpublish("first")

	// Another pod of team-a, same source: the same copy, writable by its loader.
	dir, err = k.publish("team-a", "intruder", attrs)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "model.safetensors")
	before, _ := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("not the weights the store holds"), 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(path, before.ModTime(), before.ModTime()); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(path)
	if after.Sys().(*syscall.Stat_t).Ino != before.Sys().(*syscall.Stat_t).Ino || !after.ModTime().Equal(before.ModTime()) || after.Size() != before.Size() {
		t.Fatal("the overwrite changed the file's inode, modification time or size: it does not test what it means to")
	}
	k.unpublish("intruder")

	dir, err = k.publish("team-a", "next", attrs)
	if err != nil {
		t.Fatal(err)
	}
	s := load(t, attrs[nodecachespec.AttrSource], dir)
	got, _ := os.ReadFile(path)
	if s.CacheHit || s.BytesFetched != int64(len(weights)) || string(got) != string(weights) {
		t.Fatalf("the next pod's loader: cache hit %v, %d bytes fetched (want the %d of the changed file alone), content as in the store: %v",
			s.CacheHit, s.BytesFetched, len(weights), string(got) == string(weights))
	}
	if s.Checks["sha256"] != 2 {
		t.Fatalf("summary %+v: want both files checked against the sha256 manifest", s)
	}
	// Left alone, the copy is a cache hit again, its content checked.
	k.unpublish("next")
	dir, _ = k.publish("team-a", "again", attrs)
	if s := load(t, attrs[nodecachespec.AttrSource], dir); !s.CacheHit || s.BytesFetched != 0 {
		t.Fatalf("an unchanged copy: cache hit %v, %d bytes fetched", s.CacheHit, s.BytesFetched)
	}
}

// A volume naming a source of 1.1 MB is refused at its mount: recorded, it
// would make the node's report larger than a ConfigMap may be, and no
// namespace's copy on the node would be reported any more.
func TestAVolumeCannotOverfillTheNodesReport(t *testing.T) {
	k := startPlugin(t, 0)
	long := "s3://bucket/" + strings.Repeat("m", 1100*1000)
	_, err := k.publish("team-a", "long", map[string]string{nodecachespec.AttrSource: long})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(fmt.Sprint(err), "2048") {
		t.Fatalf("publish with a 1.1 MB source: %v, want InvalidArgument naming the bound", err)
	}
	if _, err := k.publish("team-a", "long-endpoint", map[string]string{nodecachespec.AttrSource: "s3://bucket/m", nodecachespec.AttrEndpoint: "http://" + strings.Repeat("e", 3000)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish with a 3 kB endpoint: %v, want InvalidArgument", err)
	}
	if entries, _ := k.store.Entries(); len(entries) != 0 {
		t.Fatalf("the refused volumes left copies: %+v", entries)
	}

	// As many copies as the longest sources allow cannot overfill the report
	// either: it keeps the copies in use and says how many it left out.
	for i := range 300 {
		pod := fmt.Sprintf("p-%d", i)
		if _, err := k.publish(fmt.Sprintf("ns-%d", i), pod, map[string]string{nodecachespec.AttrSource: fmt.Sprintf("s3://b/%04d%s", i, strings.Repeat("x", 2000)), nodecachespec.AttrEndpoint: "http://" + strings.Repeat("e", 2000)}); err != nil {
			t.Fatal(err)
		}
		if i != 7 {
			k.unpublish(pod)
		}
	}
	entries, err := k.store.Entries()
	if err != nil {
		t.Fatal(err)
	}
	body, err := boundedReport(nodecachespec.Report{Node: "node-1", Entries: entries}, maxReportBytes)
	if err != nil {
		t.Fatal(err)
	}
	var rep nodecachespec.Report
	if err := json.Unmarshal(body, &rep); err != nil || len(body) > maxReportBytes {
		t.Fatalf("report of %d bytes (bound %d): %v", len(body), maxReportBytes, err)
	}
	inUse := false
	for _, e := range rep.Entries {
		inUse = inUse || e.Namespace == "ns-7" && e.Pods == 1
	}
	if !inUse || rep.Omitted == 0 || len(rep.Entries)+rep.Omitted != 300 {
		t.Fatalf("report: %d entries, %d omitted, the copy in use kept: %v", len(rep.Entries), rep.Omitted, inUse)
	}
}

// A volume whose sizeBytes is the largest int64 does not fit any budget: the
// pod gets a folder of its own, removed with it, never a lasting copy.
func TestTheBudgetHoldsForTheLargestSize(t *testing.T) {
	k := startPlugin(t, 1<<30)
	// A copy on the node: what the budget already holds is added to the size.
	small, err := k.publish("team-a", "small", map[string]string{nodecachespec.AttrSource: "s3://bucket/small", nodecachespec.AttrSizeBytes: "1000"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(small, "model.safetensors"), make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := k.publish("team-a", "huge", map[string]string{nodecachespec.AttrSource: "s3://bucket/huge", nodecachespec.AttrSizeBytes: "9223372036854775807"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dir, filepath.Join(k.store.Root, "scratch")) {
		t.Fatalf("the pod got %s, want a scratch folder", dir)
	}
	k.unpublish("huge")
	if entries, _ := k.store.Entries(); len(entries) != 1 {
		t.Fatalf("copies %+v, want the small model's alone", entries)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the scratch folder stayed: %v", err)
	}
}
