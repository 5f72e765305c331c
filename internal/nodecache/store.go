package nodecache

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// Store is the cache's folder on the node:
//
//	ROOT/models/KEY/          a copy: the loaders' destination (their marker, journal, files)
//	ROOT/models/KEY.json      the copy's record: whose, of what, last used
//	ROOT/volumes/VOLUME.json  a pod's mounted volume: which copy, where
//	ROOT/scratch/VOLUME/      a pod's own folder when its copy cannot fit the budget
//
// Records are written before the mount and removed after the unmount, so a
// restarted plugin still knows which copies are in use.
type Store struct {
	Root string
	// Budget bounds the copies' total size; 0 is no bound.
	Budget int64
	// UID and GID own new folders: the loader's user, which writes them.
	UID, GID int
	// Mounter mounts and unmounts (bind mounts on a node; a test may observe).
	Mounter Mounter

	mu  sync.Mutex
	now func() time.Time
}

// Mounter bind-mounts a folder of the node at a pod's volume path.
type Mounter interface {
	Bind(source, target string) error
	Unmount(target string) error
	IsMounted(target string) (bool, error)
}

// record is a copy's record.
type record struct {
	Namespace string    `json:"namespace"`
	Source    string    `json:"source"`
	Endpoint  string    `json:"endpoint,omitempty"`
	LastUsed  time.Time `json:"lastUsed"`
}

// volume is a mounted volume's record.
type volume struct {
	Key    string `json:"key,omitempty"` // empty for a scratch folder
	Target string `json:"target"`
	Pod    string `json:"pod"` // NAMESPACE/NAME
}

// Request is one pod's volume to publish.
type Request struct {
	VolumeID  string
	Target    string
	Namespace string
	Pod       string
	Source    string
	Endpoint  string
	// SizeBytes is the model's expected size (0: unknown, taken as nothing).
	SizeBytes int64
}

// Outcome says what a publish gave the pod.
type Outcome string

const (
	// OutcomeComplete: the node holds a complete copy; the loader verifies it
	// against the store and reads nothing more.
	OutcomeComplete Outcome = "Complete"
	// OutcomeShared: a copy is on the node but not complete; the pod's loader
	// resumes it, or waits while another pod's loader writes it.
	OutcomeShared Outcome = "Shared"
	// OutcomeNew: no copy yet; the pod's loader downloads one for the node.
	OutcomeNew Outcome = "New"
	// OutcomeOverBudget: the copy does not fit the node's budget beside the
	// copies in use; the pod loads into a folder of its own, removed with it.
	OutcomeOverBudget Outcome = "OverBudget"
)

// Published is the result of a publish.
type Published struct {
	Key     string
	Outcome Outcome
	// Evicted are the copies removed to make room.
	Evicted []nodecachespec.Entry
	// HitBytes is the size of the complete copy handed to the pod.
	HitBytes int64
}

func (s *Store) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

func (s *Store) modelsDir() string            { return filepath.Join(s.Root, "models") }
func (s *Store) copyDir(key string) string    { return filepath.Join(s.modelsDir(), key) }
func (s *Store) recordPath(key string) string { return filepath.Join(s.modelsDir(), key+".json") }
func (s *Store) volumePath(id string) string  { return filepath.Join(s.Root, "volumes", id+".json") }
func (s *Store) scratchDir(id string) string  { return filepath.Join(s.Root, "scratch", id) }
func validID(id string) bool {
	return id != "" && !strings.ContainsAny(id, "/\\\x00") && id != "." && id != ".."
}
func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, loadspec.CompleteMarker))
	return err == nil
}
func (s *Store) chown(path string) error { return os.Lchown(path, s.UID, s.GID) }

// Open makes the folders and forgets the volumes no longer mounted (the node
// restarted, or the kubelet cleaned up while the plugin was away), and the
// scratch folders that belonged to them.
func (s *Store) Open() error {
	for _, d := range []string{s.modelsDir(), filepath.Join(s.Root, "volumes"), filepath.Join(s.Root, "scratch")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	vols, err := s.volumes()
	if err != nil {
		return err
	}
	for id, v := range vols {
		if mounted, err := s.Mounter.IsMounted(v.Target); err == nil && !mounted {
			os.Remove(s.volumePath(id))
		}
	}
	scratch, _ := os.ReadDir(filepath.Join(s.Root, "scratch"))
	for _, e := range scratch {
		if _, ok := vols[e.Name()]; !ok {
			os.RemoveAll(s.scratchDir(e.Name()))
		}
	}
	return nil
}

// Publish gives the pod its cache folder at r.Target: the node's copy of the
// model, made room for within the budget, or a scratch folder if it cannot fit.
// Publishing the same volume again (the kubelet retries) is a no-op.
func (s *Store) Publish(r Request) (Published, error) {
	if !validID(r.VolumeID) {
		return Published{}, fmt.Errorf("invalid volume id %q", r.VolumeID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := nodecachespec.Key(r.Namespace, r.Source, r.Endpoint)
	if v, err := readJSON[volume](s.volumePath(r.VolumeID)); err == nil && v.Target == r.Target {
		if mounted, _ := s.Mounter.IsMounted(r.Target); mounted {
			return Published{Key: v.Key, Outcome: s.outcomeOf(v.Key)}, nil
		}
	}
	res := Published{Key: key}
	dir := s.copyDir(key)
	if _, err := os.Stat(dir); err == nil {
		res.Outcome = s.outcomeOf(key)
		if res.Outcome == OutcomeComplete {
			res.HitBytes = diskUsage(dir)
		}
	} else {
		evicted, fits, err := s.makeRoom(r.SizeBytes)
		if err != nil {
			return res, err
		}
		res.Evicted = evicted
		if fits {
			res.Outcome = OutcomeNew
			if err := s.mkdirOwned(dir); err != nil {
				return res, err
			}
		} else {
			res.Outcome, res.Key = OutcomeOverBudget, ""
			dir = s.scratchDir(r.VolumeID)
			if err := s.mkdirOwned(dir); err != nil {
				return res, err
			}
		}
	}
	if res.Key != "" {
		if err := writeJSON(s.recordPath(key), record{Namespace: r.Namespace, Source: r.Source, Endpoint: r.Endpoint, LastUsed: s.clock()}); err != nil {
			return res, err
		}
	}
	if err := writeJSON(s.volumePath(r.VolumeID), volume{Key: res.Key, Target: r.Target, Pod: r.Namespace + "/" + r.Pod}); err != nil {
		return res, err
	}
	if err := os.MkdirAll(r.Target, 0o750); err != nil {
		return res, err
	}
	if err := s.Mounter.Bind(dir, r.Target); err != nil {
		os.Remove(s.volumePath(r.VolumeID))
		return res, fmt.Errorf("mounting the model cache: %w", err)
	}
	return res, nil
}

func (s *Store) outcomeOf(key string) Outcome {
	if key == "" {
		return OutcomeOverBudget
	}
	if complete(s.copyDir(key)) {
		return OutcomeComplete
	}
	return OutcomeShared
}

func (s *Store) mkdirOwned(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return s.chown(dir)
}

// Unpublish unmounts the pod's volume and forgets it; the copy stays on the
// node, its last use now. Unpublishing a volume the store does not know (the
// kubelet retries) only makes sure nothing is mounted at target.
func (s *Store) Unpublish(volumeID, target string) error {
	if !validID(volumeID) {
		return fmt.Errorf("invalid volume id %q", volumeID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if mounted, err := s.Mounter.IsMounted(target); err != nil {
		return err
	} else if mounted {
		if err := s.Mounter.Unmount(target); err != nil {
			return err
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	v, err := readJSON[volume](s.volumePath(volumeID))
	if err != nil {
		return nil
	}
	if v.Key == "" {
		os.RemoveAll(s.scratchDir(volumeID))
	} else if rec, err := readJSON[record](s.recordPath(v.Key)); err == nil {
		rec.LastUsed = s.clock()
		writeJSON(s.recordPath(v.Key), rec)
	}
	return os.Remove(s.volumePath(volumeID))
}

// makeRoom evicts copies no pod has mounted, least recently used first, until
// need more bytes fit the budget. It never evicts a copy in use: if they alone
// leave no room, it says the model does not fit.
func (s *Store) makeRoom(need int64) ([]nodecachespec.Entry, bool, error) {
	if s.Budget <= 0 {
		return nil, true, nil
	}
	entries, err := s.entries()
	if err != nil {
		return nil, false, err
	}
	if need > s.Budget {
		return nil, false, nil
	}
	// Compared as used <= Budget-need: need comes from a volume attribute, and
	// used+need could overflow (sizeBytes 9223372036854775807).
	var used int64
	for _, e := range entries {
		used += e.Bytes
	}
	if used <= s.Budget-need {
		return nil, true, nil
	}
	var idle []nodecachespec.Entry
	for _, e := range entries {
		if e.Pods == 0 {
			idle = append(idle, e)
		}
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].LastUsed < idle[j].LastUsed })
	var freeable int64
	for _, e := range idle {
		freeable += e.Bytes
	}
	if used-freeable > s.Budget-need {
		return nil, false, nil // evicting everything idle would not make room: keep them
	}
	var evicted []nodecachespec.Entry
	for _, e := range idle {
		if used <= s.Budget-need {
			break
		}
		// The record goes first: a copy without one is never handed out again.
		os.Remove(s.recordPath(e.Key))
		if err := os.RemoveAll(s.copyDir(e.Key)); err != nil {
			return evicted, false, err
		}
		used -= e.Bytes
		evicted = append(evicted, e)
	}
	return evicted, true, nil
}

// Entries are the copies on the node, oldest use first.
func (s *Store) Entries() ([]nodecachespec.Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries()
}

func (s *Store) entries() ([]nodecachespec.Entry, error) {
	vols, err := s.volumes()
	if err != nil {
		return nil, err
	}
	pods := map[string]int{}
	for _, v := range vols {
		pods[v.Key]++
	}
	dirs, err := os.ReadDir(s.modelsDir())
	if err != nil {
		return nil, err
	}
	var out []nodecachespec.Entry
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		key := d.Name()
		rec, err := readJSON[record](s.recordPath(key))
		if err == nil && (len(rec.Source) > nodecachespec.MaxAttrLength || len(rec.Endpoint) > nodecachespec.MaxAttrLength) {
			err = errors.New("written before attributes were bounded") // never handed out again
		}
		if err != nil {
			// An eviction killed between its two steps: finish it, unless in use.
			if pods[key] == 0 {
				os.RemoveAll(s.copyDir(key))
			}
			continue
		}
		out = append(out, nodecachespec.Entry{
			Key: key, Namespace: rec.Namespace, Source: rec.Source, Endpoint: rec.Endpoint,
			Bytes: diskUsage(s.copyDir(key)), Complete: complete(s.copyDir(key)),
			LastUsed: rec.LastUsed.UTC().Format(time.RFC3339Nano), Pods: pods[key],
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastUsed < out[j].LastUsed })
	return out, nil
}

func (s *Store) volumes() (map[string]volume, error) {
	files, err := os.ReadDir(filepath.Join(s.Root, "volumes"))
	if err != nil {
		return nil, err
	}
	out := map[string]volume{}
	for _, f := range files {
		id, ok := strings.CutSuffix(f.Name(), ".json")
		if !ok {
			continue
		}
		if v, err := readJSON[volume](filepath.Join(s.Root, "volumes", f.Name())); err == nil {
			out[id] = v
		}
	}
	return out, nil
}

// diskUsage is the bytes of the files under dir (what the budget counts).
func diskUsage(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func readJSON[T any](path string) (T, error) {
	var v T
	b, err := os.ReadFile(path)
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal(b, &v)
}

// writeJSON replaces path whole (a torn write is never read back).
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
