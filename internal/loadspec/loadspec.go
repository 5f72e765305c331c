// Package loadspec is the contract between the operator and the model loader:
// the configuration the operator writes into the model-loading ConfigMap (and the
// loader reads from the mounted file), the summary the loader writes to its
// termination message, and the exit codes that tell the operator whether a failed
// load is worth retrying.
package loadspec

import (
	"encoding/json"
	"fmt"
	"time"
)

const (
	// ConfigFileName is the key of the ConfigMap and the file name the loader reads.
	ConfigFileName = "config.json"
	// BudgetFileName is the ConfigMap key and file name of the retry budget (see
	// Budget). It sits beside the configuration but is not part of the pod template
	// hash, so the operator can change it without rolling the pods.
	BudgetFileName = "budget.json"
	// AttemptsFileSuffix is appended to Dest to name the loader's attempt record in
	// the cache volume: it survives the kubelet restarting the loader in place.
	AttemptsFileSuffix = ".attempts.json"
	// ConfigMountDir is where the operator mounts the ConfigMap in the loader container.
	ConfigMountDir = "/etc/model-loader"
	// CredentialsMountDir is where the operator mounts the S3 credentials Secret, if any.
	CredentialsMountDir = "/var/run/secrets/model-loader"
	// ResolvedFileName is the ConfigMap key and file name of the resolved source
	// (see Resolved). Like the budget it is not part of the pod template hash:
	// once a load has resolved a Hugging Face revision or an OCI tag, every later
	// loader loads what it resolved to, without rolling the pods.
	ResolvedFileName = "resolved.json"
	// PullSecretsMountDir holds the image pull Secrets (each in a folder named
	// after it) that an oci source's loader authenticates to the registry with.
	PullSecretsMountDir = "/var/run/secrets/model-loader-pull"
	// CompleteMarker is written at the root of the destination once every file is
	// present and verified; the engine is only started on a destination that has it.
	CompleteMarker = ".model-complete.json"
)

// Environment variables the loader reads credentials from. They are the standard
// AWS names, so the default AWS credential chain sees them too.
const (
	EnvAccessKeyID     = "AWS_ACCESS_KEY_ID"
	EnvSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	EnvSessionToken    = "AWS_SESSION_TOKEN"
	// EnvHTTPBearerToken is sent as "Authorization: Bearer ..." to HTTP sources.
	EnvHTTPBearerToken = "MODEL_LOADER_HTTP_TOKEN"
	// EnvHFToken is the Hugging Face Hub token, under the name huggingface_hub reads.
	EnvHFToken = "HF_TOKEN"
)

// Config is the model-loading configuration. Every field can also be given as a
// flag of the same meaning; flags win over the file.
type Config struct {
	// Source is the model's location: s3://BUCKET/PREFIX, http(s)://...,
	// file:///PATH, hf://ORG/NAME@REVISION (the Hugging Face Hub) or
	// oci://REGISTRY/REPOSITORY:TAG (or @DIGEST).
	Source string `json:"source"`
	// HuggingFace holds options that only apply to hf:// sources.
	HuggingFace *HuggingFaceOptions `json:"huggingface,omitempty"`
	// OCI holds options that only apply to oci:// sources.
	OCI *OCIOptions `json:"oci,omitempty"`
	// Dest is the folder the model is written to (the shared cache volume).
	Dest string `json:"dest"`
	// S3 holds options that only apply to s3:// sources.
	S3 *S3Options `json:"s3,omitempty"`
	// Concurrency is how many ranged parts are fetched at once, across all files.
	Concurrency int `json:"concurrency,omitempty"`
	// PartSizeBytes is the size of one ranged part of a large file.
	PartSizeBytes int64 `json:"partSizeBytes,omitempty"`
	// Timeout bounds the whole load.
	Timeout Duration `json:"timeout,omitempty"`
	// StallTimeout is how long a part may make no progress before it is retried.
	StallTimeout Duration `json:"stallTimeout,omitempty"`
	// SHA256Manifest optionally names a file in the source ("sha256sum" format,
	// paths relative to the source) that every downloaded file is checked against.
	SHA256Manifest string `json:"sha256Manifest,omitempty"`
	// Fsync flushes every file to disk before it is moved into place and the
	// complete marker written. Set it for a destination that outlives the pod (a
	// PersistentVolume cache): after a node crash its marker then never stands over
	// data the crash lost. An emptyDir dies with the pod and needs no flush, which
	// costs disk bandwidth.
	Fsync bool `json:"fsync,omitempty"`
	// SkipMultipartETagCheck leaves the ETags of multipart-uploaded S3 objects
	// unchecked when the store keeps no checksum of them (they are then checked by
	// size, unless the sha256 manifest covers them). Checking hashes every byte
	// (MD5, about one core-second per 650 MB), which a loader held to a small CPU
	// limit may not afford; a store checksum (a CRC) costs next to nothing.
	SkipMultipartETagCheck bool `json:"skipMultipartETagCheck,omitempty"`
	// Anonymous fetches with no credentials at all: neither the pod's nor the
	// default chain's. An adapter whose source names no credentials of its own
	// is fetched so, so that the model's keys never go to another store.
	Anonymous bool `json:"anonymous,omitempty"`
	// Adapters are fetched, after the model, by a loader whose engine takes
	// adapters only at start (TGI): each into its own destination, verified
	// like the model. A failed adapter fails the load.
	Adapters []Adapter `json:"adapters,omitempty"`
}

// S3Options are the S3-specific settings.
type S3Options struct {
	// Endpoint is the URL of an S3-compatible store (MinIO, Ceph, ...). Empty means AWS.
	Endpoint string `json:"endpoint,omitempty"`
	Region   string `json:"region,omitempty"`
	// PathStyle selects path-style addressing (http://host/bucket/key), which most
	// S3-compatible stores need.
	PathStyle bool `json:"pathStyle,omitempty"`
}

// HuggingFaceOptions are the Hub-specific settings.
type HuggingFaceOptions struct {
	// Endpoint is the Hub's address (or a mirror's); empty means the Hub.
	Endpoint string `json:"endpoint,omitempty"`
	// Include and Exclude are glob patterns of the repository's files to fetch
	// and to leave out.
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude"`
}

// Patterns a Hugging Face source selects its files with when its options give
// none (api/v1's HuggingFaceSource documents them): the safetensors weights and
// the tokenizer and config files an engine reads, not duplicate PyTorch .bin
// weights, nor the original/ checkpoint or consolidated copies some
// repositories also carry.
var (
	DefaultHuggingFaceInclude = []string{"*.safetensors", "*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"}
	DefaultHuggingFaceExclude = []string{"original/*", "consolidated*"}
)

// OCIOptions are the registry-specific settings.
type OCIOptions struct {
	// PlainHTTP talks to the registry without TLS.
	PlainHTTP bool `json:"plainHTTP,omitempty"`
}

// Resolved is what a source's movable name (a Hugging Face branch or tag, an
// OCI tag) resolved to in a load, for the loads after it.
type Resolved struct {
	// Source is the configuration's source the resolution is for; a loader
	// whose source differs ignores it.
	Source string `json:"source"`
	// Revision is the Hugging Face commit, or the OCI manifest digest.
	Revision string `json:"revision"`
}

// Budget is how many loads the operator grants one pod, and whether loads stopped.
// A kubelet restarts a failed init container in place for ever (restartPolicy
// Always), so the loader itself keeps count in the cache volume and refuses to
// contact the store once the budget is spent.
type Budget struct {
	// Epoch names the budget: the pod template and the user's last retry request.
	// An attempt record of another epoch is ignored and replaced.
	Epoch string `json:"epoch"`
	// MaxAttempts bounds the loader runs of one pod in this epoch (loading.maxRetries + 1).
	MaxAttempts int `json:"maxAttempts"`
	// Backoff is the wait after a pod's first failed attempt before its next one; it
	// doubles for each further attempt, up to MaxBackoff.
	Backoff Duration `json:"backoff"`
	// Halt, when set, stops every load of this epoch: the operator declared the
	// object Failed (a permanent error, or the object's retries are spent).
	Halt *Failure `json:"halt,omitempty"`
}

// MaxBackoff caps the wait between two attempts.
const MaxBackoff = 10 * time.Minute

// RetryDelay is the wait before attempt n+1 after n failed attempts (n >= 1): the
// back-off doubled per earlier failure, capped at MaxBackoff.
func RetryDelay(backoff time.Duration, n int) time.Duration {
	d := backoff
	for i := 1; i < n && d < MaxBackoff; i++ {
		d *= 2
	}
	return min(d, MaxBackoff)
}

// Attempts is the loader's record, in the cache volume, of its runs in one epoch.
type Attempts struct {
	Epoch string `json:"epoch"`
	// Failed counts the failed attempts of this epoch.
	Failed int `json:"failed"`
	// LastFailure is the last failure and when it happened.
	LastFailure *Failure  `json:"lastFailure,omitempty"`
	LastTime    time.Time `json:"lastTime,omitempty"`
}

// Summary is what the loader writes, as JSON, to its termination message path when
// it exits, and what the operator copies into the AIInference status.
type Summary struct {
	Files int `json:"files"`
	// Bytes is the model's total size; BytesFetched what this run downloaded.
	Bytes        int64   `json:"bytes"`
	BytesFetched int64   `json:"bytesFetched"`
	Seconds      float64 `json:"seconds"`
	// ThroughputMBps is BytesFetched / Seconds, in MB/s (10^6 bytes).
	ThroughputMBps float64 `json:"throughputMBps"`
	Verified       bool    `json:"verified"`
	// CacheHit is true when the destination already held the complete model.
	CacheHit bool `json:"cacheHit,omitempty"`
	// Failure is set when the load did not succeed.
	Failure *Failure `json:"failure,omitempty"`
	// Attempts, on a LoadsHalted refusal, is the pod's record of the earlier
	// runs that contacted the store: the kubelet restarts a refused loader as
	// it does a failed one, so the restart count overstates the attempts, and
	// the failure that matters is the record's last, not the refusal.
	Attempts *Attempts `json:"attempts,omitempty"`
	// Checks counts the files by how they were verified: "sha256" (the manifest,
	// or the store's SHA256), the store's checksum named after its algorithm
	// ("crc64nvme", "crc32c", "crc32", "sha1", with "-composite" for a checksum
	// of the upload parts' checksums), "md5" (a single-part S3 ETag),
	// "multipartETag" (each upload part hashed), or "size" when the source vouches
	// for nothing more. Verified is true only when no file was checked by size
	// alone.
	Checks map[string]int `json:"checks,omitempty"`
	// Resolved is the commit (hf://) or manifest digest (oci://) the source's
	// revision or tag resolved to in this load.
	Resolved string `json:"resolved,omitempty"`
	// Retries counts requests retried after a transient error, Stalls those cut by
	// the stall watchdog.
	Retries int `json:"retries,omitempty"`
	Stalls  int `json:"stalls,omitempty"`
}

// Failure says why a load failed.
type Failure struct {
	// Reason is a stable PascalCase word (see the Reason constants).
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Retryable tells whether running the loader again may succeed.
	Retryable bool `json:"retryable"`
}

// Stable failure reasons, shared by the loader's summary and the operator's conditions.
const (
	ReasonNotFound         = "SourceNotFound"
	ReasonAccessDenied     = "AccessDenied"
	ReasonChecksumMismatch = "ChecksumMismatch"
	ReasonInvalidConfig    = "InvalidConfig"
	ReasonTimeout          = "Timeout"
	ReasonTransient        = "TransientError"
	// ReasonRepositoryNotFound: the Hub has no such repository, or it is
	// private and the token (if any) may not read it.
	ReasonRepositoryNotFound = "RepositoryNotFound"
	// ReasonRevisionNotFound: the repository has no such branch, tag or commit.
	ReasonRevisionNotFound = "RevisionNotFound"
	// ReasonGatedModel: the repository is gated, and no token was given or the
	// token's account has not been granted access.
	ReasonGatedModel = "GatedModel"
	// ReasonHalted: the loader refused to start a download: the operator halted
	// loads, this pod spent its attempts, or an earlier attempt failed permanently.
	ReasonHalted = "LoadsHalted"
)

// Exit codes of the loader. 0 is success; the operator treats ExitRetryable as worth
// another try and every other non-zero code as permanent.
const (
	ExitRetryable     = 10
	ExitInvalidConfig = 20
	ExitNotFound      = 21
	ExitAccessDenied  = 22
	ExitChecksum      = 23
	// ExitHalted: the loader made no request (see ReasonHalted).
	ExitHalted = 24
)

// ExitCodeOf is the loader's exit code for a failure reason; reasons without
// their own code (a timeout, a transient error) exit ExitRetryable.
func ExitCodeOf(reason string) int32 {
	switch reason {
	case ReasonInvalidConfig:
		return ExitInvalidConfig
	case ReasonNotFound, ReasonRepositoryNotFound, ReasonRevisionNotFound:
		return ExitNotFound
	case ReasonAccessDenied, ReasonGatedModel:
		return ExitAccessDenied
	case ReasonChecksumMismatch:
		return ExitChecksum
	case ReasonHalted:
		return ExitHalted
	}
	return ExitRetryable
}

// IsRetryableExit tells whether a loader exit code is worth another attempt.
// Codes the loader does not define (a crash, an OOM kill's 137) are treated as
// retryable: they say nothing about the model itself.
func IsRetryableExit(code int32) bool {
	switch code {
	case ExitInvalidConfig, ExitNotFound, ExitAccessDenied, ExitChecksum, ExitHalted:
		return false
	}
	return code != 0
}

// Duration is a time.Duration that reads and writes as a Go duration string ("90s").
type Duration struct{ time.Duration }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string such as "15m".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"15m\": %w", err)
	}
	parsed, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = parsed
	return nil
}

// The loader's progress endpoint: while it runs, the model-loader serves its
// progress as JSON on ProgressPath and as Prometheus metrics on /metrics, on the
// container port named ProgressPortName. kubectl-aii reads it through the API
// server's pod proxy; the engines' PodMonitor can scrape it.
const (
	ProgressPort     = 8098
	ProgressPortName = "progress"
	ProgressPath     = "/progress"
)

// Progress is what the progress endpoint answers.
type Progress struct {
	// Stage is "listing", "downloading" or "done" (then the summary follows).
	Stage string `json:"stage"`
	// Bytes of the model on disk (kept, resumed or written now) of Total.
	Bytes int64 `json:"bytes"`
	Total int64 `json:"total"`
	// Fetched is what this attempt downloaded.
	Fetched int64 `json:"fetched"`
	Files   int   `json:"files"`
	// FilesDone are the files written and checked; Checks counts them per check.
	FilesDone int            `json:"filesDone"`
	Checks    map[string]int `json:"checks,omitempty"`
	// RateBytesPerSecond is the average download rate of this attempt.
	RateBytesPerSecond float64 `json:"rateBytesPerSecond"`
	// ETASeconds is the time left at that rate; -1 when unknown.
	ETASeconds float64 `json:"etaSeconds"`
	Retries    int64   `json:"retries"`
	Stalls     int64   `json:"stalls"`
	// ElapsedSeconds is how long this attempt has run.
	ElapsedSeconds float64 `json:"elapsedSeconds"`
}
