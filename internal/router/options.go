package router

import (
	"time"

	"github.com/aiinference/operator/internal/eventrecorder"
)

// Options bound and tune the router. Zero values take the defaults.
//
// The defaults fit the chart's memory limit of 512Mi with room (the Go
// runtime is held to 80% of it, SetMemoryLimit): request bodies at most
// MaxBodiesBytes (96 MiB) in all, kept until a replica began its answer;
// about 50 KiB for each of MaxRequests (2,048) requests in the router
// (the client's and the replica's connections, their goroutines, an 8 KiB
// copy buffer); scrapes at most ScrapeParallel (4) times MaxScrapeBytes
// (1 MiB) read, and only the load's series kept; response headers at most
// 64 KiB each; the prefix index's 65,536 blocks per model (about 8 MiB);
// the cache of pods, Services and models.
type Options struct {
	// BlockSize is how many bytes of prompt make a prefix block.
	BlockSize int
	// Picker tunes each model's picker.
	Picker PickerOptions
	// MaxWaiting bounds the requests per model waiting in the router: for a
	// serving replica, or for room in one while all are saturated.
	MaxWaiting int
	// HoldTimeout bounds a request's wait for a serving replica.
	HoldTimeout time.Duration
	// Poll is how often a waiting request looks for a serving replica.
	Poll time.Duration
	// Keepalive is how often a waiting streaming request gets an SSE comment.
	Keepalive time.Duration
	// MaxBodyBytes bounds one request body.
	MaxBodyBytes int64
	// MaxBodiesBytes and MaxBodies bound the bodies held at once across
	// models: the bytes as they arrive, and the bodies being read or kept.
	MaxBodiesBytes, MaxBodies int64
	// MaxRequests bounds the requests in the router at once, from their
	// headers to the end of their answer.
	MaxRequests int64
	// NamespaceShare and ModelShare are how much of each router-wide bound
	// (MaxBodiesBytes, MaxBodies, MaxRequests) one namespace's models, and
	// one model, may hold: a tenant that floods, trickles or has a slow
	// engine fills its own share, not the others'.
	NamespaceShare, ModelShare float64
	// BodyReadTimeout bounds reading a request's headers and body.
	BodyReadTimeout time.Duration
	// HeaderTimeout bounds a replica's wait before the headers of an answer
	// that is not streamed (an engine sends them with the whole answer).
	HeaderTimeout time.Duration
	// StreamHeaderTimeout bounds a replica's wait before the headers of a
	// streamed answer, which engines send before the first token: a replica
	// that accepted the request and sent nothing by then is taken as silent,
	// and the request goes to another.
	StreamHeaderTimeout time.Duration
	// MaxRetries bounds the other replicas a request is sent to after a
	// replica failed it before its answer began (a refused connection is
	// not counted: nothing was sent).
	MaxRetries int
	// RetryBudget is the share of the model's requests being sent that may
	// be retries at once, as Envoy's retry budgets; MinRetries are always
	// allowed. A failing replica then costs at most that much more load.
	RetryBudget float64
	MinRetries  int
	// SessionHeader names the header a client keeps a session by.
	SessionHeader string
	// ScrapeInterval is how often the engines' /metrics are read.
	ScrapeInterval time.Duration
	// MaxScrapeBytes bounds the /metrics read from one replica, and
	// ScrapeParallel the replicas read at once.
	MaxScrapeBytes int64
	ScrapeParallel int
	// DrainDelay is how long a stopping router still takes new requests
	// while its pod leaves the Services' endpoints (see Serve).
	DrainDelay time.Duration
	// ShutdownTimeout bounds, after the drain delay, the wait for the
	// requests in flight to finish; what is left then is cut. DrainDelay and
	// ShutdownTimeout together must fit in the pod's
	// terminationGracePeriodSeconds.
	ShutdownTimeout time.Duration
	// Events records a model's replicas taken out of the picking and back;
	// nil: none.
	Events *eventrecorder.Recorder
}

// Defaults.
const (
	DefaultBlockSize           = 256
	DefaultMaxWaiting          = 100
	DefaultHoldTimeout         = 5 * time.Minute
	DefaultMaxBodyBytes        = 8 << 20
	DefaultMaxBodiesBytes      = 96 << 20
	DefaultMaxBodies           = 1024
	DefaultMaxRequests         = 2048
	DefaultNamespaceShare      = 0.5
	DefaultModelShare          = 0.25
	DefaultBodyReadTimeout     = 30 * time.Second
	DefaultHeaderTimeout       = 10 * time.Minute
	DefaultStreamHeaderTimeout = 10 * time.Second
	DefaultMaxRetries          = 2
	DefaultRetryBudget         = 0.2
	DefaultMinRetries          = 3
	DefaultSessionHeader       = "X-Session-ID"
	DefaultScrapeInterval      = time.Second
	DefaultMaxScrapeBytes      = 1 << 20
	DefaultScrapeParallel      = 4
	// The router's pods have terminationGracePeriodSeconds: 60.
	DefaultDrainDelay      = 5 * time.Second
	DefaultShutdownTimeout = 50 * time.Second
)

func (o Options) withDefaults() Options {
	set := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	setInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	setShare := func(v *float64, d float64) {
		if *v <= 0 || *v > 1 {
			*v = d
		}
	}
	setDuration := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	setInt(&o.BlockSize, DefaultBlockSize)
	setInt(&o.MaxWaiting, DefaultMaxWaiting)
	set(&o.MaxBodyBytes, DefaultMaxBodyBytes)
	set(&o.MaxBodiesBytes, DefaultMaxBodiesBytes)
	set(&o.MaxBodies, DefaultMaxBodies)
	set(&o.MaxRequests, DefaultMaxRequests)
	setShare(&o.NamespaceShare, DefaultNamespaceShare)
	setShare(&o.ModelShare, DefaultModelShare)
	setShare(&o.RetryBudget, DefaultRetryBudget)
	if o.MaxRetries < 0 {
		o.MaxRetries = 0
	} else if o.MaxRetries == 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	setInt(&o.MinRetries, DefaultMinRetries)
	setInt(&o.ScrapeParallel, DefaultScrapeParallel)
	set(&o.MaxScrapeBytes, DefaultMaxScrapeBytes)
	setDuration(&o.HoldTimeout, DefaultHoldTimeout)
	setDuration(&o.Poll, 100*time.Millisecond)
	setDuration(&o.Keepalive, 15*time.Second)
	setDuration(&o.BodyReadTimeout, DefaultBodyReadTimeout)
	setDuration(&o.HeaderTimeout, DefaultHeaderTimeout)
	setDuration(&o.StreamHeaderTimeout, DefaultStreamHeaderTimeout)
	setDuration(&o.ScrapeInterval, DefaultScrapeInterval)
	setDuration(&o.DrainDelay, DefaultDrainDelay)
	setDuration(&o.ShutdownTimeout, DefaultShutdownTimeout)
	if o.SessionHeader == "" {
		o.SessionHeader = DefaultSessionHeader
	}
	return o
}
