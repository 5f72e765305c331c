package loader

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

// Options is everything one run of the loader needs: the operator's configuration
// (loadspec.Config) and the settings that only concern this process.
type Options struct {
	loadspec.Config
	// ProgressInterval is how often progress is logged.
	ProgressInterval time.Duration
	// TerminationMessagePath receives the JSON summary ("" writes none).
	TerminationMessagePath string
	// CredentialsDir holds credential files named like the environment variables
	// (AWS_ACCESS_KEY_ID, ...), as a mounted Secret does. Missing is fine.
	CredentialsDir string
	// CheckMultipartETag checks the ETag of multipart-uploaded S3 objects by
	// hashing (MD5) each upload part as it streams. It costs about one core-second
	// per 650 MB; without it such objects are checked by size alone (and the
	// summary says so), unless a sha256 manifest covers them.
	CheckMultipartETag bool
	// StoreChecksums checks S3 objects against the checksum the store keeps
	// (CRC64NVME, which AWS S3 adds to every new object, CRC32C, CRC32, SHA256,
	// SHA1) when it has one: a CRC costs next to nothing, so this comes before the
	// ETag checks. Off is for stores that report checksums they do not keep.
	StoreChecksums bool
	// ProgressAddress is where the progress endpoint listens (e.g. :8098); empty: none.
	ProgressAddress string
	// Progress receives each attempt's progress, for the endpoint; nil: none.
	Progress *ProgressBoard
	// Budget is the operator's retry budget (see runBudgeted); nil when there is no
	// budget file, as when the loader runs by hand: then nothing bounds the loads.
	Budget *loadspec.Budget
	// PullSecretsDir holds the image pull Secrets an oci source authenticates
	// with, each in a folder of its own (loadspec.PullSecretsMountDir).
	PullSecretsDir string
	// Resolved is what an earlier load resolved the source's revision or tag
	// to (resolved.json beside the configuration); nil: none yet.
	Resolved *loadspec.Resolved
}

// Defaults for settings neither the file nor the flags give.
const (
	// DefaultConcurrency: an S3 connection carries 50-100 MB/s, so a GPU node's
	// network card (25-100 Gbit/s) needs some 40-150 at once. More than the card
	// needs also shortens the end of a load: while the card is shared, every part
	// in flight advances, so less is left for the last ones to fetch at a single
	// connection's rate. Through the benchmark's store-shaped link (make
	// bench-loader, which needs 40 connections), 64 reached 90% of the card and
	// 128 reached 96%. Each costs one 128 KiB buffer and its connection's.
	DefaultConcurrency      = 128
	DefaultPartSize         = 16 << 20
	DefaultTimeout          = 2 * time.Hour
	DefaultStallTimeout     = 30 * time.Second
	DefaultProgressInterval = 5 * time.Second
	// minPartSize keeps parts large enough for request overhead not to dominate.
	minPartSize = 64 << 10
)

// flagValues holds what the command line said, before it is merged over the file.
type flagValues struct {
	config, source, dest, endpoint, region, manifest string
	budget                                           string
	pathStyle                                        bool
	concurrency                                      int
	partSize                                         string
	timeout, stallTimeout                            time.Duration
	progressInterval                                 time.Duration
	progressAddress                                  string
	terminationPath, credentialsDir, pullSecretsDir  string
	fsync, checkMultipart, storeChecksums            bool
}

// DefaultConfigPath is where the operator mounts the configuration.
var DefaultConfigPath = filepath.Join(loadspec.ConfigMountDir, loadspec.ConfigFileName)

// ParseArgs reads the command line and the configuration file it names (by default
// the operator's mount, which may be absent); flags win over the file. Credentials
// are never flags: they come from the environment or from CredentialsDir.
func ParseArgs(args []string, stderr io.Writer) (Options, error) {
	fset := flag.NewFlagSet("model-loader", flag.ContinueOnError)
	fset.SetOutput(stderr)
	var fv flagValues
	fset.StringVar(&fv.config, "config", DefaultConfigPath, "configuration file (JSON, the operator's schema); a missing file at the default path is ignored")
	fset.StringVar(&fv.budget, "budget", "", "retry budget file (JSON, the operator's schema); default: "+loadspec.BudgetFileName+" beside --config, and none when that is missing")
	fset.StringVar(&fv.source, "source", "", "model location: s3://BUCKET/PREFIX, http(s)://HOST/PATH, file:///PATH, hf://ORG/NAME[@REVISION] (the Hugging Face Hub; HF_TOKEN for gated models) or oci://REGISTRY/REPOSITORY:TAG (or @sha256:DIGEST)")
	fset.StringVar(&fv.dest, "dest", "", "destination folder")
	fset.StringVar(&fv.endpoint, "endpoint", "", "S3 endpoint URL of an S3-compatible store (empty: AWS)")
	fset.StringVar(&fv.region, "region", "", "S3 region (default from the environment, else us-east-1)")
	fset.BoolVar(&fv.pathStyle, "path-style", false, "S3 path-style addressing (most S3-compatible stores need it)")
	fset.StringVar(&fv.manifest, "sha256-manifest", "", "file in the source, in sha256sum format, that every file is checked against; for an http(s) folder source (URL ending in /) it also lists the files")
	fset.IntVar(&fv.concurrency, "concurrency", 0, fmt.Sprintf("ranged requests in flight across all files (default %d)", DefaultConcurrency))
	fset.StringVar(&fv.partSize, "part-size", "", fmt.Sprintf("size of one ranged request, e.g. 16Mi, 8MB, 1048576 (default %dMi); the files queued last are fetched in parts of a quarter of it, at least 1Mi", DefaultPartSize>>20))
	fset.DurationVar(&fv.timeout, "timeout", 0, fmt.Sprintf("bound on the whole load (default %s)", DefaultTimeout))
	fset.DurationVar(&fv.stallTimeout, "stall-timeout", 0, fmt.Sprintf("a part that receives no byte for this long is cancelled and retried (default %s)", DefaultStallTimeout))
	fset.DurationVar(&fv.progressInterval, "progress-interval", DefaultProgressInterval, "how often progress is logged")
	fset.StringVar(&fv.progressAddress, "progress-address", "", "address of the progress endpoint (JSON on "+loadspec.ProgressPath+", Prometheus metrics on /metrics), e.g. :8098; empty: none")
	fset.StringVar(&fv.terminationPath, "termination-message-path", "/dev/termination-log", "file that receives the JSON summary")
	fset.StringVar(&fv.credentialsDir, "credentials-dir", loadspec.CredentialsMountDir, "folder of credential files named like the environment variables (AWS_ACCESS_KEY_ID, ...)")
	fset.StringVar(&fv.pullSecretsDir, "pull-secrets-dir", loadspec.PullSecretsMountDir, "folder of image pull Secrets (each a folder holding .dockerconfigjson) an oci:// source authenticates to its registry with")
	fset.BoolVar(&fv.fsync, "fsync", false, "flush every file to disk before it is renamed into place and the marker written (for a destination that outlives the pod)")
	partial := func() Options { return Options{TerminationMessagePath: fv.terminationPath} }
	fset.BoolVar(&fv.checkMultipart, "check-multipart-etag", true, "check the ETag of multipart-uploaded S3 objects the store keeps no checksum of by hashing each upload part (MD5, about one core-second per 650 MB); off, they are checked by size only")
	fset.BoolVar(&fv.storeChecksums, "store-checksums", true, "check S3 objects against the checksum the store keeps (CRC64NVME, CRC32C, CRC32, SHA256, SHA1), when it has one, before any ETag check")
	if err := fset.Parse(args); err != nil {
		return partial(), &Error{Reason: loadspec.ReasonInvalidConfig, Err: err}
	}
	if fset.NArg() > 0 {
		return partial(), failf(loadspec.ReasonInvalidConfig, "", "unexpected arguments %q", fset.Args())
	}
	set := map[string]bool{}
	fset.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var file loadspec.Config
	data, err := os.ReadFile(fv.config)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &file); err != nil {
			return partial(), failf(loadspec.ReasonInvalidConfig, "", "configuration file %s: %v", fv.config, err)
		}
	case errors.Is(err, fs.ErrNotExist) && !set["config"]:
	default:
		return partial(), failf(loadspec.ReasonInvalidConfig, "", "configuration file: %v", err)
	}
	o, err := mergeOptions(file, fv, set)
	if err != nil {
		return o, err
	}
	budgetPath := fv.budget
	if !set["budget"] {
		budgetPath = filepath.Join(filepath.Dir(fv.config), loadspec.BudgetFileName)
	}
	if o.Budget, err = readBudget(budgetPath, set["budget"]); err != nil {
		return o, err
	}
	o.Resolved, err = readResolved(filepath.Join(filepath.Dir(fv.config), loadspec.ResolvedFileName))
	return o, err
}

// mergeOptions lays the flags that were set over the file's configuration, fills
// defaults and validates the result.
func mergeOptions(file loadspec.Config, fv flagValues, set map[string]bool) (Options, error) {
	o := Options{Config: file}
	if o.S3 == nil {
		o.S3 = &loadspec.S3Options{}
	} else {
		s3 := *o.S3
		o.S3 = &s3
	}
	if set["source"] {
		o.Source = fv.source
	}
	if set["dest"] {
		o.Dest = fv.dest
	}
	if set["endpoint"] {
		o.S3.Endpoint = fv.endpoint
	}
	if set["region"] {
		o.S3.Region = fv.region
	}
	if set["path-style"] {
		o.S3.PathStyle = fv.pathStyle
	}
	if set["sha256-manifest"] {
		o.SHA256Manifest = fv.manifest
	}
	if set["concurrency"] {
		o.Concurrency = fv.concurrency
	}
	if set["part-size"] {
		n, err := parseSize(fv.partSize)
		if err != nil {
			return Options{TerminationMessagePath: fv.terminationPath}, failf(loadspec.ReasonInvalidConfig, "", "--part-size: %v", err)
		}
		o.PartSizeBytes = n
	}
	if set["timeout"] {
		o.Timeout.Duration = fv.timeout
	}
	if set["stall-timeout"] {
		o.StallTimeout.Duration = fv.stallTimeout
	}
	o.ProgressInterval = fv.progressInterval
	o.ProgressAddress = fv.progressAddress
	o.TerminationMessagePath = fv.terminationPath
	o.CredentialsDir = fv.credentialsDir
	o.PullSecretsDir = fv.pullSecretsDir
	if set["fsync"] {
		o.Fsync = fv.fsync
	}
	o.CheckMultipartETag = !o.SkipMultipartETagCheck
	if set["check-multipart-etag"] {
		o.CheckMultipartETag = fv.checkMultipart
	}
	o.StoreChecksums = !set["store-checksums"] || fv.storeChecksums
	o = o.withDefaults()
	return o, o.validate()
}

// withDefaults fills the settings left at zero.
func (o Options) withDefaults() Options {
	if o.S3 == nil {
		o.S3 = &loadspec.S3Options{}
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.PartSizeBytes == 0 {
		o.PartSizeBytes = DefaultPartSize
	}
	if o.Timeout.Duration == 0 {
		o.Timeout.Duration = DefaultTimeout
	}
	if o.StallTimeout.Duration == 0 {
		o.StallTimeout.Duration = DefaultStallTimeout
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
	return o
}

// DefaultOptions are the process settings of a loader given no flags: every
// check on, the default concurrency and timeouts.
func DefaultOptions() Options {
	return Options{CheckMultipartETag: true, StoreChecksums: true}.withDefaults()
}

// AdapterOptions are the options of one adapter's fetch: its own configuration
// with this process's settings (credentials, checks, progress logging), and no
// budget, progress board or termination message of its own.
func (o Options) AdapterOptions(cfg loadspec.Config) (Options, error) {
	a := Options{
		Config:             cfg,
		ProgressInterval:   o.ProgressInterval,
		CredentialsDir:     o.CredentialsDir,
		CheckMultipartETag: !cfg.SkipMultipartETagCheck && o.CheckMultipartETag,
		StoreChecksums:     o.StoreChecksums,
	}
	a.Adapters = nil
	a = a.withDefaults()
	return a, a.validate()
}

func (o Options) validate() error {
	bad := func(format string, args ...any) error {
		return failf(loadspec.ReasonInvalidConfig, "", format, args...)
	}
	switch {
	case o.Source == "":
		return bad("no source: give --source or \"source\" in the configuration file")
	case o.Dest == "":
		return bad("no destination: give --dest or \"dest\" in the configuration file")
	case o.Concurrency < 1 || o.Concurrency > 1024:
		return bad("concurrency %d is outside 1..1024", o.Concurrency)
	case o.PartSizeBytes < minPartSize:
		return bad("part size %d is below the minimum of %d bytes", o.PartSizeBytes, minPartSize)
	case o.Timeout.Duration < 0 || o.StallTimeout.Duration < 0:
		return bad("timeouts must be positive")
	}
	if _, err := parseSource(o.Source); err != nil {
		return err
	}
	if o.SHA256Manifest != "" && (strings.HasPrefix(o.SHA256Manifest, "/") || strings.Contains(o.SHA256Manifest, "..")) {
		return bad("sha256 manifest %q must be a path relative to the source", o.SHA256Manifest)
	}
	return nil
}

// parseSize reads a byte count: a plain number, or one with a suffix
// K/M/G (powers of 10, optionally followed by B) or Ki/Mi/Gi (powers of 2).
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
		{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"B", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size such as 16Mi, 8MB or 1048576", s)
	}
	return n * mult, nil
}

// readResolved reads the resolved source file; a missing one is none.
func readResolved(path string) (*loadspec.Resolved, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "resolved source file: %v", err)
	}
	var r loadspec.Resolved
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "resolved source file %s: %v", path, err)
	}
	return &r, nil
}
